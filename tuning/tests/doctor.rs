//! Every doctor check against fixture sysfs/procfs trees and hand-made
//! device facts: the ok path, the warn/fail path with its exact fix, and
//! the unreadable path ("cannot read X: reason").

mod common;

use common::*;
use pinpoll::EngineConfig;
use pinpoll_tune::doctor::{Report, Status};
use pinpoll_tune::facts::{self, Source};

fn host() -> Fixture {
    let fx = Fixture::empty("host");
    tuned_host(&fx);
    mlx5(&fx);
    fx
}

fn guest() -> Fixture {
    let fx = Fixture::empty("guest");
    rxe_guest(&fx);
    fx
}

fn host_report(fx: &Fixture, cfg: &EngineConfig, cores: &[usize]) -> Report {
    doctor(fx, &inventory(vec![mlx5_facts()]), cfg, cores)
}

#[test]
fn a_tuned_hardware_host_passes_every_check() {
    let fx = host();
    let report = host_report(&fx, &config("hugepages = \"2M\""), &[2]);
    let not_ok: Vec<_> = report
        .findings
        .iter()
        .filter(|f| f.status != Status::Ok)
        .collect();
    assert!(not_ok.is_empty(), "{}", report.to_table());
    assert_eq!(report.status(), Status::Ok);
    // One row per check, per device and port.
    for check in [
        "rdma.devices",
        "device.kind",
        "port.state",
        "port.link_layer",
        "port.mtu",
        "port.gid",
        "profile.fit",
        "device.capacity",
        "numa.locality",
        "irq.affinity",
        "hugepages.2M",
        "hugepages.1G",
        "memlock",
        "mm.thp",
        "cpu.cores",
        "cpu.governor",
        "cpu.cstates",
        "kernel.isolcpus",
        "kernel.nohz_full",
        "kernel.rcu_nocbs",
    ] {
        one(&report, check, None);
    }
    let kind = one(&report, "device.kind", Some("mlx5_0"));
    assert_contains(&kind.finding, "hardware: 0000:3b:00.0, driver mlx5_core");
    let gid = one(&report, "port.gid", Some("mlx5_0/1"));
    assert_contains(
        &gid.finding,
        "GID 1 fe80::a00:27ff:fe00:1 (RoCE v2 on ens1f0)",
    );
    assert_contains(
        &one(&report, "numa.locality", None).finding,
        "worker core(s) 2 on the NIC's node 1 (cpus 2-3)",
    );
    assert_contains(
        &one(&report, "irq.affinity", None).finding,
        "3 IRQ(s) of 0000:3b:00.0 (matched by PCI address and msi_irqs: mlx5_async0@pci:0000:3b:00.0",
    );
    assert_contains(
        &one(&report, "hugepages.2M", None).finding,
        "256 reserved, 256 free",
    );
    assert_contains(
        &one(&report, "kernel.isolcpus", None).finding,
        "isolcpus=managed_irq,domain,2-3 covers worker core(s) 2",
    );
}

#[test]
fn the_softroce_guest_is_reported_as_softroce() {
    let fx = guest();
    let report = doctor(
        &fx,
        &inventory(vec![rxe_facts()]),
        &EngineConfig::default(),
        &[],
    );
    let kind = one(&report, "device.kind", Some("rxe0"));
    assert_eq!(kind.status, Status::Warn);
    assert_contains(&kind.finding, "SoftRoCE (rxe) over netdev rxenet0");
    assert_contains(&kind.finding, "-> /sys/devices/virtual/infiniband/rxe0");
    assert_contains(&kind.finding, "functional, not hardware");
    assert_contains(&kind.finding, "vendor_id 0xffffff = rxe's");
    assert_eq!(
        one(&report, "port.state", Some("rxe0/1")).finding,
        "ACTIVE (phys_state 5: LinkUp)"
    );
    assert_contains(
        &one(&report, "numa.locality", None).finding,
        "SoftRoCE over rxenet0, a virtual netdev",
    );
    assert_contains(
        &one(&report, "irq.affinity", None).finding,
        "SoftRoCE raises no interrupts of its own",
    );
    assert_eq!(one(&report, "cpu.cstates", None).status, Status::Ok);
    assert_contains(
        &one(&report, "cpu.governor", None).finding,
        "no cpufreq on 0-1",
    );
    // No failure: the guest runs pinpoll.
    assert_ne!(report.status(), Status::Fail, "{}", report.to_table());

    let json = report.to_json();
    let dev = &json["devices"][0];
    assert_eq!(dev["name"], "rxe0");
    assert_eq!(dev["softroce"], true);
    assert_eq!(dev["kind"], "softroce");
    assert_eq!(dev["netdev"], "rxenet0");
    assert_eq!(dev["max_inline_data"], 512);
    assert_eq!(dev["ports"][0]["state"], "ACTIVE");
    assert_eq!(dev["ports"][0]["selected_gid"], 0);
    assert_eq!(json["hugepages"]["2M"]["total"], 256);
    assert_eq!(json["hugepages"]["1G"]["total"], 0);
    assert_eq!(json["memlock"]["limit"], "unlimited");
    assert_eq!(json["status"], "warn");
    let checks = json["checks"].as_array().unwrap();
    assert_eq!(checks.len(), report.findings.len());
    let total: u64 = ["ok", "warn", "fail"]
        .iter()
        .map(|s| json["summary"][s].as_u64().unwrap())
        .sum();
    assert_eq!(total as usize, checks.len());
}

#[test]
fn no_rdma_device_fails_and_says_how_to_get_one() {
    let fx = Fixture::empty("nodev");
    tuned_host(&fx);
    let report = doctor(&fx, &inventory(vec![]), &EngineConfig::default(), &[2]);
    let f = one(&report, "rdma.devices", None);
    assert_eq!(f.status, Status::Fail);
    assert_contains(
        &f.finding,
        "no /sys/class/infiniband: no RDMA driver is loaded",
    );
    assert_contains(
        f.fix.as_deref().unwrap(),
        "rdma link add rxe0 type rxe netdev",
    );
    assert_eq!(report.status(), Status::Fail);
    // A verbs listing error is reported as such.
    let inv = facts::Inventory {
        source: Source::Verbs,
        listing: Err("ibv_get_device_list failed: Permission denied".into()),
        devices: vec![],
    };
    let report = doctor(&fx, &inv, &EngineConfig::default(), &[]);
    assert_contains(
        &one(&report, "rdma.devices", None).finding,
        "cannot list RDMA devices: ibv_get_device_list failed: Permission denied",
    );
}

#[test]
fn a_device_the_kernel_has_but_verbs_does_not_list_is_a_warning() {
    let fx = host();
    let inv = facts::Inventory {
        source: Source::Verbs,
        listing: Ok(vec![]),
        devices: vec![],
    };
    let report = doctor(&fx, &inv, &EngineConfig::default(), &[]);
    assert_contains(
        &one(&report, "rdma.devices", None).finding,
        "/sys/class/infiniband has mlx5_0",
    );
}

#[test]
fn a_port_that_is_down_fails_with_the_netdev_to_bring_up() {
    let fx = host();
    fx.file(
        "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/infiniband/mlx5_0/ports/1/phys_state",
        "3: Disabled",
    );
    let mut dev = mlx5_facts();
    if let Ok(ports) = &mut dev.ports {
        ports[0].state = Ok(facts::PortState {
            code: 1,
            name: "DOWN".into(),
        });
    }
    let report = doctor(&fx, &inventory(vec![dev]), &EngineConfig::default(), &[2]);
    let f = one(&report, "port.state", Some("mlx5_0/1"));
    assert_eq!(f.status, Status::Fail);
    assert_eq!(
        f.finding,
        "DOWN (1) (phys_state 3: Disabled): queue pairs cannot connect"
    );
    assert_contains(f.fix.as_deref().unwrap(), "`ip link set dev ens1f0 up`");
    assert_eq!(report.status(), Status::Fail);

    // InfiniBand in INIT: a subnet manager is missing.
    let mut dev = mlx5_facts();
    if let Ok(ports) = &mut dev.ports {
        ports[0].state = Ok(facts::PortState {
            code: 2,
            name: "INIT".into(),
        });
        ports[0].link_layer = Ok(facts::LinkLayer::InfiniBand);
    }
    let report = doctor(&fx, &inventory(vec![dev]), &EngineConfig::default(), &[2]);
    let f = one(&report, "port.state", None);
    assert_contains(f.fix.as_deref().unwrap(), "systemctl start opensm");
}

#[test]
fn an_active_mtu_below_max_warns_with_the_netdev_mtu_to_set() {
    let fx = guest();
    let report = doctor(
        &fx,
        &inventory(vec![rxe_facts()]),
        &EngineConfig::default(),
        &[],
    );
    let f = one(&report, "port.mtu", Some("rxe0/1"));
    assert_eq!(f.status, Status::Warn);
    assert_contains(&f.finding, "active 1024 < max 4096 bytes");
    assert_contains(
        f.fix.as_deref().unwrap(),
        "`ip link set dev rxenet0 mtu 4200`",
    );
    // InfiniBand: the subnet manager's partition MTU.
    let mut dev = rxe_facts();
    if let Ok(ports) = &mut dev.ports {
        ports[0].link_layer = Ok(facts::LinkLayer::InfiniBand);
    }
    let report = doctor(&fx, &inventory(vec![dev]), &EngineConfig::default(), &[]);
    assert_contains(
        one(&report, "port.mtu", None).fix.as_deref().unwrap(),
        "mtu=5 : ALL=full;",
    );
    // Unknown MTU (no verbs): says why.
    let mut dev = rxe_facts();
    if let Ok(ports) = &mut dev.ports {
        ports[0].active_mtu = Err("ibv_query_port(port 1) failed: Invalid argument".into());
    }
    let report = doctor(&fx, &inventory(vec![dev]), &EngineConfig::default(), &[]);
    let f = one(&report, "port.mtu", None);
    assert_eq!(f.status, Status::Warn);
    assert_eq!(
        f.finding,
        "cannot read the port MTU: ibv_query_port(port 1) failed: Invalid argument"
    );
}

#[test]
fn gid_types_decide_the_gid_check() {
    let fx = host();
    let with_gids = |gids| {
        let mut dev = mlx5_facts();
        dev.ports = Ok(vec![active_port(4096, gids)]);
        doctor(&fx, &inventory(vec![dev]), &EngineConfig::default(), &[2])
    };
    let report = with_gids(vec![gid(0, "fe80::a00:27ff:fe00:1", "IB/RoCE v1")]);
    let f = one(&report, "port.gid", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(&f.finding, "RoCE v1 is not routable");
    assert_contains(f.fix.as_deref().unwrap(), "dev ens1f0");

    let report = with_gids(vec![]);
    let f = one(&report, "port.gid", None);
    assert_eq!(f.status, Status::Fail);
    assert_contains(
        f.fix.as_deref().unwrap(),
        "ip addr add <address>/<prefix> dev ens1f0",
    );

    // A gid_index that is not populated fails and lists the populated ones.
    let mut dev = mlx5_facts();
    dev.ports = Ok(vec![active_port(4096, vec![gid(1, "fe80::1", "RoCE v2")])]);
    let report = doctor(&fx, &inventory(vec![dev]), &config("gid_index = 3"), &[2]);
    let f = one(&report, "port.gid", None);
    assert_eq!(f.status, Status::Fail);
    assert_contains(
        &f.finding,
        "gid_index (field qp.gid_index) = 3 is not a populated GID",
    );
    assert_contains(f.fix.as_deref().unwrap(), "to one of 1");
}

#[test]
fn a_profile_that_does_not_fit_the_device_fails() {
    let fx = guest();
    let cfg = config(
        "inline_threshold = 1024\nsend_queue_depth = 64\ncq_depth = 65536\nrecv_queue_depth = 64",
    );
    let report = doctor(&fx, &inventory(vec![rxe_facts()]), &cfg, &[]);
    let f = one(&report, "profile.fit", Some("rxe0"));
    assert_eq!(f.status, Status::Fail);
    assert_contains(&f.finding, "inline_threshold = 1024 > 512");
    assert_contains(&f.finding, "cq_depth = 65536 > 32767 (max_cqe)");
    assert_eq!(
        f.fix.as_deref().unwrap(),
        "in the profile set cq_depth = 32767, inline_threshold = 512"
    );
    let report = doctor(
        &fx,
        &inventory(vec![rxe_facts()]),
        &EngineConfig::load("softroce").unwrap(),
        &[],
    );
    assert_eq!(one(&report, "profile.fit", None).status, Status::Ok);
}

/// The doctor says how many connections of the profile a device holds at
/// once and which of its limits is the tightest: rxe runs out of memory
/// regions first (4 a connection), a ConnectX of queue pairs; and it
/// says what shared receive queues the device offers.
#[test]
fn the_device_s_capacity_names_its_tightest_limit() {
    let fx = guest();
    let softroce = EngineConfig::load("softroce").unwrap();
    let report = doctor(&fx, &inventory(vec![rxe_facts()]), &softroce, &[]);
    let f = one(&report, "device.capacity", Some("rxe0"));
    assert_eq!(f.status, Status::Ok);
    assert_contains(
        &f.finding,
        "rxe0 holds 131071 connections of profile test at once",
    );
    assert_contains(&f.finding, "4 memory regions");
    assert_contains(&f.finding, "the tightest limit is max_mr 524287");
    assert_contains(
        &f.finding,
        "max_srq 917503, of up to max_srq_wr 1048576 receives each",
    );
    let report = doctor(&host(), &inventory(vec![mlx5_facts()]), &softroce, &[]);
    let f = one(&report, "device.capacity", Some("mlx5_0"));
    assert_contains(&f.finding, "mlx5_0 holds 262144 connections");
    assert_contains(&f.finding, "the tightest limit is max_qp 262144");
    // A device that cannot hold one connection fails the check.
    let mut starved = rxe_facts();
    starved.limits.as_mut().unwrap().max_mr = 3;
    let report = doctor(&fx, &inventory(vec![starved]), &softroce, &[]);
    let f = one(&report, "device.capacity", Some("rxe0"));
    assert_eq!(f.status, Status::Fail);
    assert_contains(&f.finding, "holds 0 connections");
}

#[test]
fn huge_pages_are_checked_against_what_the_profile_maps() {
    let fx = host();
    // slot 1 MiB x 64 = 64 MiB per ring = 32 pages, x3, + recv 1 MiB x 64 = 32: 128 pages.
    let cfg = config("hugepages = \"2M\"\nslot_size = 1048576\nslot_count = 64\nrecv_queue_depth = 64\nsend_queue_depth = 64\ncq_depth = 128");
    hugepages(&fx, "2048", 100, 90, 10);
    let report = host_report(&fx, &cfg, &[2]);
    let f = one(&report, "hugepages.2M", None);
    assert_eq!(f.status, Status::Fail);
    assert_contains(&f.finding, "100 reserved, 90 free, 10 promised to mappings");
    assert_contains(
        &f.finding,
        "maps 128 2 MiB page(s) per connection and only 80 can be had",
    );
    assert_contains(
        f.fix.as_deref().unwrap(),
        "`echo 148 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`",
    );

    // None reserved, none needed: a warning with the command.
    hugepages(&fx, "2048", 0, 0, 0);
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    let f = one(&report, "hugepages.2M", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(f.fix.as_deref().unwrap(), "echo 256 >");

    // 1 GiB pages asked for on a kernel without them.
    fx.remove("/sys/kernel/mm/hugepages/hugepages-1048576kB");
    let report = host_report(&fx, &config("hugepages = \"1G\""), &[2]);
    let f = one(&report, "hugepages.1G", None);
    assert_eq!(f.status, Status::Fail);
    assert_contains(&f.finding, "this kernel has no 1 GiB huge pages");

    // Unreadable counter: a directory where the file should be.
    fx.directory_instead("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    let f = one(&report, "hugepages.2M", None);
    assert_eq!(f.status, Status::Warn);
    assert_eq!(
        f.finding,
        format!(
            "cannot read {}/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages: Is a directory",
            fx.path().display()
        )
    );
}

#[test]
fn the_memlock_limit_is_checked_against_what_a_connection_locks() {
    let fx = host();
    let limits = |soft: &str| {
        fx.file(
            "/proc/self/limits",
            &format!("Limit                     Soft Limit           Hard Limit           Units     \nMax locked memory         {soft:<20} unlimited            bytes     "),
        );
    };
    limits("65536");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    let f = one(&report, "memlock", None);
    assert_eq!(f.status, Status::Fail);
    assert_contains(&f.finding, "ulimit -l: 64 KiB");
    assert_contains(&f.finding, "locks 4 MiB per connection");
    assert_contains(f.fix.as_deref().unwrap(), "ulimit -l unlimited");
    assert_eq!(report.status(), Status::Fail);

    // CAP_IPC_LOCK (bit 14) exempts the process.
    fx.file("/proc/self/status", "Name:\tx\nCapEff:\t0000000000004000");
    let f = host_report(&fx, &EngineConfig::default(), &[2]);
    assert_eq!(one(&f, "memlock", None).status, Status::Ok);

    fx.file("/proc/self/status", "Name:\tx\nCapEff:\t0000000000000000");
    limits("67108864");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    assert_contains(
        &one(&report, "memlock", None).finding,
        "room for 16 connection(s)",
    );

    fx.dangling("/proc/self/limits");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    let f = one(&report, "memlock", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(&f.finding, "cannot read ");
    assert_contains(&f.finding, "/proc/self/limits: No such file or directory");
}

#[test]
fn transparent_huge_pages_always_is_a_warning() {
    let fx = guest();
    let report = doctor(
        &fx,
        &inventory(vec![rxe_facts()]),
        &EngineConfig::default(),
        &[],
    );
    let f = one(&report, "mm.thp", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(&f.finding, "enabled [always], defrag [madvise]");
    assert_eq!(
        f.fix.as_deref().unwrap(),
        "`echo madvise > /sys/kernel/mm/transparent_hugepage/enabled` (at boot: transparent_hugepage=madvise)"
    );
    fx.remove("/sys/kernel/mm/transparent_hugepage");
    let report = doctor(
        &fx,
        &inventory(vec![rxe_facts()]),
        &EngineConfig::default(),
        &[],
    );
    assert_eq!(one(&report, "mm.thp", None).status, Status::Ok);
    fx.file("/sys/kernel/mm/transparent_hugepage/enabled", "garbage");
    let report = doctor(
        &fx,
        &inventory(vec![rxe_facts()]),
        &EngineConfig::default(),
        &[],
    );
    let f = one(&report, "mm.thp", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(&f.finding, "no [choice] in \"garbage\"");
}

#[test]
fn a_slow_governor_on_the_worker_cores_warns() {
    let fx = host();
    fx.file(
        "/sys/devices/system/cpu/cpu2/cpufreq/scaling_governor",
        "powersave",
    )
    .file(
        "/sys/devices/system/cpu/cpu3/cpufreq/scaling_governor",
        "schedutil",
    );
    let report = host_report(&fx, &EngineConfig::default(), &[2, 3]);
    let f = one(&report, "cpu.governor", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(&f.finding, "worker cores: powersave on 2; schedutil on 3");
    assert_eq!(
        f.fix.as_deref().unwrap(),
        "`cpupower -c 2-3 frequency-set -g performance` (or `echo performance | tee /sys/devices/system/cpu/cpu{2,3}/cpufreq/scaling_governor`)"
    );
    // Cores 0-1 are still on performance.
    let report = host_report(&fx, &EngineConfig::default(), &[1]);
    assert_eq!(one(&report, "cpu.governor", None).status, Status::Ok);
    // A dangling governor link cannot be read.
    fx.dangling("/sys/devices/system/cpu/cpu2/cpufreq/scaling_governor");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    let f = one(&report, "cpu.governor", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(
        &f.finding,
        "cpu2/cpufreq/scaling_governor: No such file or directory",
    );
}

#[test]
fn deep_c_states_on_the_worker_cores_warn() {
    let fx = host();
    fx.file("/sys/devices/system/cpu/cpu2/cpuidle/state2/disable", "0");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    let f = one(&report, "cpu.cstates", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(
        &f.finding,
        "(cpuidle driver intel_idle): deep C-states enabled: C6 (170 µs) on 2",
    );
    assert_contains(f.fix.as_deref().unwrap(), "`cpupower -c 2 idle-set -D 10`");
    // Core 3 still has C6 disabled.
    let report = host_report(&fx, &EngineConfig::default(), &[3]);
    let f = one(&report, "cpu.cstates", None);
    assert_eq!(f.status, Status::Ok);
    assert_contains(
        &f.finding,
        "enabled states all exit within 10 µs (C1, POLL)",
    );
    fx.directory_instead("/sys/devices/system/cpu/cpu3/cpuidle/state1/latency");
    let report = host_report(&fx, &EngineConfig::default(), &[3]);
    let f = one(&report, "cpu.cstates", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(&f.finding, "state1/latency: Is a directory");
}

#[test]
fn worker_cores_outside_isolcpus_nohz_full_rcu_nocbs_warn_with_the_parameter() {
    let fx = host();
    fx.file(
        "/proc/cmdline",
        "ro quiet isolcpus=nohz,domain,3 rcu_nocbs=2-3",
    );
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    let iso = one(&report, "kernel.isolcpus", None);
    assert_eq!(iso.status, Status::Warn);
    assert_contains(
        &iso.finding,
        "isolcpus=nohz,domain,3 does not cover worker core(s) 2",
    );
    assert_contains(
        iso.fix.as_deref().unwrap(),
        "make it isolcpus=nohz,domain,2-3 on the kernel command line",
    );
    let nohz = one(&report, "kernel.nohz_full", None);
    assert_eq!(nohz.status, Status::Warn);
    assert_contains(
        &nohz.finding,
        "no nohz_full= on the kernel command line, so it does not cover worker core(s) 2",
    );
    assert_contains(
        nohz.fix.as_deref().unwrap(),
        "add nohz_full=2 on the kernel command line",
    );
    assert_eq!(one(&report, "kernel.rcu_nocbs", None).status, Status::Ok);

    // Without worker cores: present lists are reported, absent ones warned.
    let report = host_report(&fx, &EngineConfig::default(), &[]);
    assert_contains(
        &one(&report, "kernel.isolcpus", None).finding,
        "pick worker cores from 3",
    );
    assert_eq!(one(&report, "kernel.nohz_full", None).status, Status::Warn);

    // The init arguments after `--` are not kernel parameters.
    fx.file("/proc/cmdline", "ro -- isolcpus=2");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    assert_eq!(one(&report, "kernel.isolcpus", None).status, Status::Warn);

    fx.directory_instead("/proc/cmdline");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    for check in ["kernel.isolcpus", "kernel.nohz_full", "kernel.rcu_nocbs"] {
        let f = one(&report, check, None);
        assert_eq!(f.status, Status::Warn);
        assert_contains(&f.finding, "/proc/cmdline: Is a directory");
    }
}

#[test]
fn worker_cores_off_the_nics_numa_node_warn() {
    let fx = host();
    let report = host_report(&fx, &EngineConfig::default(), &[1]);
    let f = one(&report, "numa.locality", Some("mlx5_0"));
    assert_eq!(f.status, Status::Warn);
    assert_contains(
        &f.finding,
        "worker core(s) 1 are not on the NIC's node 1 (cpus 2-3)",
    );
    assert_contains(f.fix.as_deref().unwrap(), "`--cores 2-3`");
    // No node reported on a one-node machine is fine.
    fx.file(
        "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/numa_node",
        "-1",
    )
    .remove("/sys/devices/system/node/node1");
    let report = host_report(&fx, &EngineConfig::default(), &[1]);
    assert_eq!(one(&report, "numa.locality", None).status, Status::Ok);
    fx.dangling("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/numa_node");
    let report = host_report(&fx, &EngineConfig::default(), &[1]);
    let f = one(&report, "numa.locality", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(
        &f.finding,
        "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/numa_node: No such file or directory",
    );
}

#[test]
fn nic_interrupts_on_a_worker_core_warn_with_the_affinity_to_set() {
    let fx = host();
    let report = host_report(&fx, &EngineConfig::default(), &[3]);
    let f = one(&report, "irq.affinity", Some("mlx5_0"));
    assert_eq!(f.status, Status::Warn);
    assert_contains(
        &f.finding,
        "mlx5_async0@pci:0000:3b:00.0, mlx5_comp0@pci:0000:3b:00.0",
    );
    assert_contains(&f.finding, "IRQ(s) 40 41 42 may fire on worker core(s) 3");
    assert_eq!(
        f.fix.as_deref().unwrap(),
        "stop irqbalance from moving them back (`systemctl stop irqbalance`, or IRQBALANCE_BANNED_CPULIST=3 in /etc/default/irqbalance), then `for i in 40 41 42; do echo 2 > /proc/irq/$i/smp_affinity_list; done`"
    );
    // Matched by driver name when no line names the address.
    let text = std::fs::read_to_string(fx.path().join("proc/interrupts"))
        .unwrap()
        .replace("@pci:0000:3b:00.0", "")
        .replace("IR-PCI-MSI-0000:3b:00.0", "IR-PCI-MSI");
    fx.file("/proc/interrupts", text.trim_end());
    fx.remove("/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/msi_irqs");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    let f = one(&report, "irq.affinity", None);
    assert_eq!(f.status, Status::Ok, "{}", report.to_table());
    assert_contains(
        &f.finding,
        "2 IRQ(s) of 0000:3b:00.0 (matched by driver name mlx5_comp",
    );
    // An affinity file that cannot be read.
    fx.dangling("/proc/irq/41/smp_affinity_list");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    let f = one(&report, "irq.affinity", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(
        &f.finding,
        "/proc/irq/41/smp_affinity_list: No such file or directory",
    );
}

#[test]
fn worker_cores_must_be_online_and_not_core_0() {
    let fx = host();
    let report = host_report(&fx, &EngineConfig::default(), &[2, 7]);
    let f = one(&report, "cpu.cores", None);
    assert_eq!(f.status, Status::Fail);
    assert_contains(
        &f.finding,
        "worker core(s) 7 (--cores) are not online (online: 0-3)",
    );
    let report = host_report(&fx, &EngineConfig::default(), &[0]);
    let f = one(&report, "cpu.cores", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(f.fix.as_deref().unwrap(), "one of 1-3");
    let report = host_report(&fx, &EngineConfig::default(), &[]);
    assert_eq!(one(&report, "cpu.cores", None).status, Status::Warn);
}

#[test]
fn an_unreadable_device_link_is_reported_not_guessed() {
    let fx = host();
    fx.dangling("/sys/class/infiniband/mlx5_0");
    let report = host_report(&fx, &EngineConfig::default(), &[2]);
    for check in ["device.kind", "numa.locality", "irq.affinity"] {
        let f = one(&report, check, Some("mlx5_0"));
        assert_eq!(f.status, Status::Warn, "{check}");
        assert_contains(&f.finding, "cannot read ");
        assert_contains(
            &f.finding,
            "/sys/class/infiniband/mlx5_0: No such file or directory",
        );
    }
}

#[test]
fn sysfs_facts_come_from_the_tree() {
    let fx = guest();
    let inv = facts::gather_sysfs(&fx.root(), None, "no verbs in this test");
    assert_eq!(inv.source, Source::Sysfs);
    assert_eq!(inv.listing, Ok(vec!["rxe0".to_owned()]));
    let dev = &inv.devices[0];
    assert_eq!(dev.limits, Err("no verbs in this test".to_owned()));
    let port = &dev.ports.as_ref().unwrap()[0];
    assert_eq!(port.port, 1);
    assert!(port.state.as_ref().unwrap().is_active());
    assert_eq!(port.link_layer, Ok(facts::LinkLayer::Ethernet));
    assert_eq!(
        port.gids.as_ref().unwrap(),
        &vec![
            gid(0, "fe80::5054:ff:fe50:1", "RoCE v2"),
            gid(1, "::ffff:169.254.0.1", "RoCE v2")
        ]
    );
    // The doctor over sysfs facts alone: unknown facts are warnings that say why.
    let report = doctor(&fx, &inv, &EngineConfig::default(), &[]);
    assert_eq!(one(&report, "port.state", None).status, Status::Ok);
    assert_eq!(
        one(&report, "profile.fit", None).finding,
        "cannot check profile test against the device: no verbs in this test"
    );
    // A port state file that is a directory.
    fx.directory_instead("/sys/devices/virtual/infiniband/rxe0/ports/1/state");
    let inv = facts::gather_sysfs(&fx.root(), None, "no verbs");
    let report = doctor(&fx, &inv, &EngineConfig::default(), &[]);
    let f = one(&report, "port.state", None);
    assert_eq!(f.status, Status::Warn);
    assert_contains(&f.finding, "ports/1/state: Is a directory");
    // --device filters.
    assert!(facts::gather_sysfs(&fx.root(), Some("mlx5_0"), "x")
        .devices
        .is_empty());
}

#[test]
fn asking_for_a_missing_device_fails() {
    let fx = guest();
    let root = fx.root();
    let inv = facts::gather_sysfs(&root, Some("mlx5_0"), "x");
    let cfg = EngineConfig::default();
    let inputs = pinpoll_tune::doctor::Inputs {
        root: &root,
        inventory: &inv,
        config: &cfg,
        profile: None,
        device: Some("mlx5_0".into()),
        cores: Default::default(),
        cores_from: pinpoll_tune::doctor::CoresFrom::None,
    };
    let report = pinpoll_tune::doctor::run(&inputs);
    let f = one(&report, "rdma.devices", None);
    assert_eq!(f.status, Status::Fail);
    assert_eq!(f.finding, "no RDMA device \"mlx5_0\" (have: rxe0)");
}

// ---- the binary, over a fixture root

#[test]
fn the_cli_reads_a_fixture_root_and_exits_by_status() {
    let fx = guest();
    let root = fx.path().to_str().unwrap();
    let out = tune(&["doctor", "--root", root, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", out.stderr.as_str());
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["context"]["source"], "sysfs");
    assert_eq!(json["devices"][0]["softroce"], true);
    assert_eq!(json["devices"][0]["ports"][0]["state"], "ACTIVE");
    assert!(json["devices"][0]["limits"]["error"]
        .as_str()
        .unwrap()
        .contains("verbs queries are skipped with --root"));

    let out = tune(&["doctor", "--root", root, "--cores", "1"]);
    let table = out.stdout;
    assert!(table.starts_with("pinpoll-tune doctor: the default configuration (no --profile), worker cores 1 (--cores)"), "{table}");
    assert_contains(&table, "CHECK                   STATUS  FINDING\n");
    assert_contains(
        &table,
        "\nport.state rxe0/1       ok      ACTIVE (phys_state 5: LinkUp)\n",
    );
    assert_contains(
        &table,
        "fix: `echo madvise > /sys/kernel/mm/transparent_hugepage/enabled`",
    );

    // A failing check: exit status 1, in both output forms.
    fx.file(
        "/sys/devices/virtual/infiniband/rxe0/ports/1/state",
        "1: DOWN",
    );
    assert_eq!(tune(&["doctor", "--root", root]).status.code(), Some(1));
    let out = tune(&["doctor", "--root", root, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let json: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    assert_eq!(json["status"], "fail");
}

#[test]
fn cli_usage_errors_are_one_line() {
    let out = tune(&["doctor", "--root", "/nonexistent-pinpoll-root"]);
    assert_eq!(out.status.code(), Some(2));
    let err = out.stderr;
    assert_eq!(
        err,
        "error: --root /nonexistent-pinpoll-root: not a directory\n"
    );
    let out = tune(&["doctor", "--profile", "no-such-profile", "--root", "/tmp"]);
    assert_eq!(out.status.code(), Some(2));
    let err = out.stderr;
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with(
            "error: no profile named \"no-such-profile\": the built-in ones are latency, throughput, softroce"
        ),
        "{err}"
    );
    let out = tune(&["doctor", "--cores", "3-1"]);
    assert_eq!(out.status.code(), Some(2));
    assert_contains(
        &out.stderr,
        "\"3-1\" in \"3-1\" is not a CPU number or range",
    );
}

#[test]
fn help_explains_every_flag() {
    let out = tune(&["doctor", "--help"]);
    let help = out.stdout;
    for flag in [
        "--profile <NAME|FILE>",
        "--cores <LIST>",
        "--device <NAME>",
        "--json",
        "--root <DIR>",
        "For testing",
    ] {
        assert_contains(&help, flag);
    }
}

#[test]
fn softroce_over_a_pci_nic_follows_the_netdev_to_its_pci_function() {
    let fx = guest();
    // rxe0 over eth0, a virtio-net device under PCI function 0000:00:03.0
    // on node 0 with two MSI-X vectors on CPU 1.
    let pci = "/sys/devices/pci0000:00/0000:00:03.0";
    fx.file("/sys/devices/virtual/infiniband/rxe0/parent", "eth0")
        .symlink("/sys/class/net/eth0", "../../devices/pci0000:00/0000:00:03.0/virtio0/net/eth0")
        .symlink(&format!("{pci}/virtio0/net/eth0/device"), "../../../virtio0")
        .file(&format!("{pci}/numa_node"), "0")
        .file(&format!("{pci}/msi_irqs/25"), "msix")
        .file(&format!("{pci}/msi_irqs/26"), "msix")
        .file(
            "/proc/interrupts",
            "           CPU0       CPU1\n 25:          0        136   PCI-MSI 98305-edge      virtio0-input.0\n 26:          0         12   PCI-MSI 98306-edge      virtio0-output.0",
        )
        .file("/proc/irq/25/smp_affinity_list", "1")
        .file("/proc/irq/26/smp_affinity_list", "0");
    let report = doctor(
        &fx,
        &inventory(vec![rxe_facts()]),
        &EngineConfig::default(),
        &[1],
    );
    let irq = one(&report, "irq.affinity", Some("rxe0"));
    assert_eq!(irq.status, Status::Warn, "{}", report.to_table());
    assert_contains(
        &irq.finding,
        "2 IRQ(s) of 0000:00:03.0 (matched by msi_irqs: virtio0-input.0, virtio0-output.0)",
    );
    assert_contains(
        irq.fix.as_deref().unwrap(),
        "for i in 25; do echo 0 > /proc/irq/$i/smp_affinity_list; done",
    );
    let numa = one(&report, "numa.locality", Some("rxe0"));
    assert_eq!(numa.status, Status::Ok);
    assert_contains(
        &numa.finding,
        "worker core(s) 1 on the NIC's node 0 (cpus 0-1)",
    );
    assert_eq!(report.to_json()["devices"][0]["numa_node"], 0);
}
