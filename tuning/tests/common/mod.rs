//! Fixture system roots: fake /sys and /proc trees under a temp dir, laid
//! out like the real ones (relative symlinks included), and hand-made device
//! facts to go with them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use pinpoll::gid::GidEntry;
use pinpoll::EngineConfig;
use pinpoll_testkit::{command, Finished, Running, Scratch};
use pinpoll_tune::cpulist::CpuSet;
use pinpoll_tune::doctor::{self, CoresFrom, Finding, Inputs, Report};
use pinpoll_tune::facts::{
    DeviceFacts, DeviceLimits, Inventory, LinkLayer, PortFacts, PortState, Source,
};
use pinpoll_tune::SystemRoot;

/// A temp directory laid out like `/`, removed on drop.
pub struct Fixture {
    scratch: Scratch,
}

impl Fixture {
    pub fn empty(name: &str) -> Fixture {
        Fixture {
            scratch: Scratch::new(&format!("pinpoll-tune-{name}")),
        }
    }

    fn at(&self, path: &str) -> PathBuf {
        self.scratch.join(path.trim_start_matches('/'))
    }

    /// Writes `content` (a trailing newline added, as sysfs has) at `path`.
    pub fn file(&self, path: &str, content: &str) -> &Self {
        let p = self.at(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&p);
        std::fs::write(&p, format!("{content}\n")).unwrap();
        self
    }

    pub fn dir(&self, path: &str) -> &Self {
        std::fs::create_dir_all(self.at(path)).unwrap();
        self
    }

    /// A relative symlink at `path` to `target`, as sysfs makes them.
    pub fn symlink(&self, path: &str, target: &str) -> &Self {
        let p = self.at(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let _ = std::fs::remove_file(&p);
        std::os::unix::fs::symlink(target, &p).unwrap();
        self
    }

    pub fn remove(&self, path: &str) -> &Self {
        let p = self.at(path);
        if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p).unwrap();
        } else {
            std::fs::remove_file(&p).unwrap();
        }
        self
    }

    /// Makes `path` unreadable as a file even for root: a directory where a
    /// file is expected (reading it fails with EISDIR).
    pub fn directory_instead(&self, path: &str) -> &Self {
        let p = self.at(path);
        let _ = std::fs::remove_file(&p);
        std::fs::create_dir_all(&p).unwrap();
        self
    }

    /// Makes `path` a dangling symlink (reading it fails with ENOENT while
    /// the name exists).
    pub fn dangling(&self, path: &str) -> &Self {
        self.symlink(path, "does-not-exist")
    }

    pub fn root(&self) -> SystemRoot {
        SystemRoot::new(self.path())
    }

    pub fn path(&self) -> &Path {
        self.scratch.path()
    }
}

/// The bound of one `pinpoll-tune` run on the host: the program owns the
/// real bounds (its `--timeout`); this only turns a hang into a failure.
pub const BOUND: Duration = Duration::from_secs(300);

/// `pinpoll-tune args` as [`tune`] runs it: without the caller's profile
/// directory, so only the built-in and shipped profiles count.
pub fn tune_command(args: &[&str]) -> Command {
    let mut cmd = command(env!("CARGO_BIN_EXE_pinpoll-tune"), args);
    cmd.env_remove("PINPOLL_PROFILE_DIR");
    cmd
}

/// Runs `pinpoll-tune args` to completion (a hang fails after [`BOUND`]).
pub fn tune(args: &[&str]) -> Finished {
    Running::spawn(tune_command(args)).finish_within(BOUND)
}

/// The host-wide part of a well-tuned two-node machine with CPUs 0-3
/// (node 0: 0-1, node 1: 2-3), workers meant for cores 2-3.
pub fn tuned_host(fx: &Fixture) {
    fx.file(
        "/proc/cmdline",
        "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro isolcpus=managed_irq,domain,2-3 nohz_full=2-3 rcu_nocbs=2-3 quiet",
    )
    .file(
        "/proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units     \n\
         Max cpu time              unlimited            unlimited            seconds   \n\
         Max locked memory         unlimited            unlimited            bytes     \n\
         Max address space         unlimited            unlimited            bytes     ",
    )
    .file(
        "/proc/self/status",
        "Name:\tpinpoll-tune\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000",
    )
    .file("/proc/interrupts", "           CPU0       CPU1       CPU2       CPU3\n  0:         85          0          0          0   IO-APIC   2-edge      timer\nNMI:          0          0          0          0   Non-maskable interrupts")
    .file("/sys/devices/system/cpu/online", "0-3")
    .file("/sys/devices/system/cpu/cpuidle/current_driver", "intel_idle")
    .file("/sys/devices/system/node/node0/cpulist", "0-1")
    .file("/sys/devices/system/node/node1/cpulist", "2-3")
    .file("/sys/devices/system/node/online", "0-1")
    .file("/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never")
    .file(
        "/sys/kernel/mm/transparent_hugepage/defrag",
        "always defer defer+madvise [madvise] never",
    );
    for cpu in 0..4 {
        let base = format!("/sys/devices/system/cpu/cpu{cpu}");
        fx.file(&format!("{base}/cpufreq/scaling_governor"), "performance");
        for (i, name, latency, disable) in [(0, "POLL", 0, 0), (1, "C1", 2, 0), (2, "C6", 170, 1)] {
            let s = format!("{base}/cpuidle/state{i}");
            fx.file(&format!("{s}/name"), name)
                .file(&format!("{s}/latency"), &latency.to_string())
                .file(&format!("{s}/disable"), &disable.to_string());
        }
    }
    hugepages(fx, "2048", 256, 256, 0);
    hugepages(fx, "1048576", 0, 0, 0);
}

pub fn hugepages(fx: &Fixture, kb: &str, total: u64, free: u64, resv: u64) {
    let d = format!("/sys/kernel/mm/hugepages/hugepages-{kb}kB");
    fx.file(&format!("{d}/nr_hugepages"), &total.to_string())
        .file(&format!("{d}/free_hugepages"), &free.to_string())
        .file(&format!("{d}/resv_hugepages"), &resv.to_string())
        .file(&format!("{d}/surplus_hugepages"), "0");
}

pub const MLX5_PCI: &str = "0000:3b:00.0";
const MLX5_DEV: &str = "/sys/devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0";

/// A ConnectX (mlx5_0, RoCE on ens1f0) on node 1, port ACTIVE, with three
/// MSI-X vectors (40: async, 41-42: completions) steered to CPU 3.
pub fn mlx5(fx: &Fixture) {
    let ib = format!("{MLX5_DEV}/infiniband/mlx5_0");
    fx.symlink(
        "/sys/class/infiniband/mlx5_0",
        "../../devices/pci0000:3a/0000:3a:00.0/0000:3b:00.0/infiniband/mlx5_0",
    )
    .symlink(&format!("{ib}/device"), "../../../0000:3b:00.0")
    .dir("/sys/bus/pci/drivers/mlx5_core")
    .symlink(
        &format!("{MLX5_DEV}/driver"),
        "../../../../bus/pci/drivers/mlx5_core",
    )
    .file(&format!("{MLX5_DEV}/numa_node"), "1")
    .file(&format!("{MLX5_DEV}/msi_irqs/40"), "msix")
    .file(&format!("{MLX5_DEV}/msi_irqs/41"), "msix")
    .file(&format!("{MLX5_DEV}/msi_irqs/42"), "msix")
    .dir(&format!("{MLX5_DEV}/net/ens1f0"))
    .file(&format!("{ib}/node_desc"), "host mlx5_0")
    .file(&format!("{ib}/ports/1/state"), "4: ACTIVE")
    .file(&format!("{ib}/ports/1/phys_state"), "5: LinkUp")
    .file(&format!("{ib}/ports/1/link_layer"), "Ethernet")
    .file(&format!("{ib}/ports/1/gids/0"), "fe80:0000:0000:0000:0a00:27ff:fe00:0001")
    .file(&format!("{ib}/ports/1/gids/1"), "fe80:0000:0000:0000:0a00:27ff:fe00:0001")
    .file(&format!("{ib}/ports/1/gids/2"), "0000:0000:0000:0000:0000:0000:0000:0000")
    .file(&format!("{ib}/ports/1/gid_attrs/types/0"), "IB/RoCE v1")
    .file(&format!("{ib}/ports/1/gid_attrs/types/1"), "RoCE v2")
    .file(&format!("{ib}/ports/1/gid_attrs/ndevs/0"), "ens1f0")
    .file(&format!("{ib}/ports/1/gid_attrs/ndevs/1"), "ens1f0")
    .file(
        "/proc/interrupts",
        "           CPU0       CPU1       CPU2       CPU3\n\
         \x20 0:         85          0          0          0   IO-APIC   2-edge      timer\n\
         \x2040:          0          0          0         12   IR-PCI-MSI-0000:3b:00.0    0-edge      mlx5_async0@pci:0000:3b:00.0\n\
         \x2041:          0          0          0       5033   IR-PCI-MSI-0000:3b:00.0    1-edge      mlx5_comp0@pci:0000:3b:00.0\n\
         \x2042:          0          0          0        171   IR-PCI-MSI-0000:3b:00.0    2-edge      mlx5_comp1@pci:0000:3b:00.0\n\
         \x2050:          3          0          0          0   IR-PCI-MSI-0000:00:1f.6    0-edge      eno1\n\
         NMI:          0          0          0          0   Non-maskable interrupts",
    );
    for irq in [0, 40, 41, 42, 50] {
        fx.file(
            &format!("/proc/irq/{irq}/smp_affinity_list"),
            if (40..50).contains(&irq) { "3" } else { "0-3" },
        );
    }
}

/// The SoftRoCE guest: rxe0 over the dummy netdev rxenet0, port ACTIVE,
/// two CPUs, 256 2 MiB pages, no cpufreq or cpuidle.
pub fn rxe_guest(fx: &Fixture) {
    let ib = "/sys/devices/virtual/infiniband/rxe0";
    fx.symlink(
        "/sys/class/infiniband/rxe0",
        "../../devices/virtual/infiniband/rxe0",
    )
    .symlink(
        "/sys/class/net/rxenet0",
        "../../devices/virtual/net/rxenet0",
    )
    .file("/sys/devices/virtual/net/rxenet0/mtu", "1500")
    .file(&format!("{ib}/parent"), "rxenet0")
    .file(&format!("{ib}/node_desc"), "rxe")
    .file(&format!("{ib}/ports/1/state"), "4: ACTIVE")
    .file(&format!("{ib}/ports/1/phys_state"), "5: LinkUp")
    .file(&format!("{ib}/ports/1/link_layer"), "Ethernet")
    .file(
        &format!("{ib}/ports/1/gids/0"),
        "fe80:0000:0000:0000:5054:00ff:fe50:0001",
    )
    .file(
        &format!("{ib}/ports/1/gids/1"),
        "0000:0000:0000:0000:0000:ffff:a9fe:0001",
    )
    .file(
        &format!("{ib}/ports/1/gids/2"),
        "0000:0000:0000:0000:0000:0000:0000:0000",
    )
    .file(&format!("{ib}/ports/1/gid_attrs/types/0"), "RoCE v2")
    .file(&format!("{ib}/ports/1/gid_attrs/types/1"), "RoCE v2")
    .file(&format!("{ib}/ports/1/gid_attrs/ndevs/0"), "rxenet0")
    .file(&format!("{ib}/ports/1/gid_attrs/ndevs/1"), "rxenet0")
    .file(
        "/proc/cmdline",
        "console=ttyS0 quiet loglevel=4 panic=-1 mitigations=off hugepagesz=2M hugepages=256",
    )
    .file(
        "/proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units     \n\
             Max locked memory         unlimited            unlimited            bytes     ",
    )
    .file(
        "/proc/self/status",
        "Name:\tpinpoll-tune\nCapEff:\t000001ffffffffff",
    )
    .file(
        "/proc/interrupts",
        "           CPU0       CPU1\n  0:         85          0   IO-APIC   2-edge      timer",
    )
    .file("/sys/devices/system/cpu/online", "0-1")
    .dir("/sys/devices/system/cpu/cpu0")
    .dir("/sys/devices/system/cpu/cpu1")
    .file("/sys/devices/system/cpu/cpuidle/current_driver", "none")
    .file("/sys/devices/system/node/node0/cpulist", "0-1")
    .file(
        "/sys/kernel/mm/transparent_hugepage/enabled",
        "[always] madvise never",
    )
    .file(
        "/sys/kernel/mm/transparent_hugepage/defrag",
        "always defer defer+madvise [madvise] never",
    );
    hugepages(fx, "2048", 256, 256, 0);
    hugepages(fx, "1048576", 0, 0, 0);
}

pub fn gid(index: u32, text: &str, kind: &str) -> GidEntry {
    GidEntry {
        index,
        gid: text.parse::<std::net::Ipv6Addr>().unwrap().octets(),
        kind: kind.into(),
    }
}

pub fn active_port(mtu: u32, gids: Vec<GidEntry>) -> PortFacts {
    PortFacts {
        port: 1,
        state: Ok(PortState {
            code: 4,
            name: "ACTIVE".into(),
        }),
        active_mtu: Ok(mtu),
        max_mtu: Ok(4096),
        link_layer: Ok(LinkLayer::Ethernet),
        gids: Ok(gids),
    }
}

/// What verbs say about the ConnectX of [`mlx5`].
pub fn mlx5_facts() -> DeviceFacts {
    DeviceFacts {
        name: "mlx5_0".into(),
        limits: Ok(DeviceLimits {
            max_qp: 262_144,
            max_cq: 16_777_216,
            max_mr: 16_777_216,
            max_pd: 16_777_216,
            max_srq: 8_388_608,
            max_srq_wr: 32767,
            max_qp_wr: 32768,
            max_cqe: 4_194_303,
            max_sge: 30,
            max_qp_rd_atom: 16,
            phys_port_cnt: 1,
            vendor_id: 0x02c9,
            vendor_part_id: 4123,
        }),
        ports: Ok(vec![active_port(
            4096,
            vec![
                gid(0, "fe80::a00:27ff:fe00:1", "IB/RoCE v1"),
                gid(1, "fe80::a00:27ff:fe00:1", "RoCE v2"),
            ],
        )]),
        max_inline_data: Ok(828),
    }
}

/// What verbs say about rxe0 of [`rxe_guest`] (rxe in Linux 6.x).
pub fn rxe_facts() -> DeviceFacts {
    DeviceFacts {
        name: "rxe0".into(),
        limits: Ok(DeviceLimits {
            // As `ibv_devinfo -v` shows them in the guest (Linux 6.1).
            max_qp: 1_048_560,
            max_cq: 1_048_576,
            max_mr: 524_287,
            max_pd: 1_048_576,
            max_srq: 917_503,
            max_srq_wr: 1_048_576,
            max_qp_wr: 1_048_576,
            max_cqe: 32767,
            max_sge: 32,
            max_qp_rd_atom: 128,
            phys_port_cnt: 1,
            vendor_id: 0x00ff_ffff,
            vendor_part_id: 0,
        }),
        ports: Ok(vec![active_port(
            1024,
            vec![
                gid(0, "fe80::5054:ff:fe50:1", "RoCE v2"),
                gid(1, "::ffff:169.254.0.1", "RoCE v2"),
            ],
        )]),
        max_inline_data: Ok(512),
    }
}

pub fn inventory(devices: Vec<DeviceFacts>) -> Inventory {
    Inventory {
        source: Source::Verbs,
        listing: Ok(devices.iter().map(|d| d.name.clone()).collect()),
        devices,
    }
}

pub fn config(toml: &str) -> EngineConfig {
    EngineConfig::from_toml(toml).unwrap_or_else(|e| panic!("{toml}: {e}"))
}

/// Runs the doctor over a fixture, with worker `cores` from --cores.
pub fn doctor(fx: &Fixture, inv: &Inventory, cfg: &EngineConfig, cores: &[usize]) -> Report {
    let root = fx.root();
    let cores: CpuSet = cores.iter().copied().collect();
    let inputs = Inputs {
        root: &root,
        inventory: inv,
        config: cfg,
        profile: Some("test".into()),
        device: None,
        cores_from: if cores.is_empty() {
            CoresFrom::None
        } else {
            CoresFrom::Flag
        },
        cores,
    };
    doctor::run(&inputs)
}

/// The one finding of `check` (about `subject`, if given); panics with the
/// whole report otherwise.
pub fn one<'a>(report: &'a Report, check: &str, subject: Option<&str>) -> &'a Finding {
    let found: Vec<&Finding> = report
        .findings
        .iter()
        .filter(|f| f.check == check && (subject.is_none() || f.subject.as_deref() == subject))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {check} finding expected in:\n{}",
        report.to_table()
    );
    found[0]
}

#[track_caller]
pub fn assert_contains(text: &str, part: &str) {
    assert!(text.contains(part), "{text:?}\n  should contain {part:?}");
}

/// Checks that `svg` is well-formed XML as we write it: every element
/// closed in order, attributes quoted, only the five entities.
#[track_caller]
pub fn assert_well_formed(svg: &str) {
    let body = svg
        .strip_prefix("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n")
        .expect("an XML declaration");
    let mut stack: Vec<String> = Vec::new();
    let mut rest = body;
    let mut roots = 0;
    while let Some(open) = rest.find('<') {
        let text = &rest[..open];
        check_text(text);
        let close = rest[open..].find('>').expect("a tag closes") + open;
        let tag = &rest[open + 1..close];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(
                stack.pop().as_deref(),
                Some(name.trim()),
                "mismatched </{name}>"
            );
        } else {
            let self_closing = tag.ends_with('/');
            let tag = tag.trim_end_matches('/');
            let name = tag.split_whitespace().next().expect("a tag name");
            assert!(
                name.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':'),
                "{name}"
            );
            let attrs = &tag[name.len()..];
            assert_eq!(
                attrs.matches('"').count() % 2,
                0,
                "unbalanced quotes in <{tag}>"
            );
            check_text(attrs);
            if stack.is_empty() {
                roots += 1;
            }
            if !self_closing {
                stack.push(name.to_owned());
            }
        }
        rest = &rest[close + 1..];
    }
    assert!(stack.is_empty(), "unclosed {stack:?}");
    assert_eq!(roots, 1, "one root element");
    assert!(rest.trim().is_empty());
}

fn check_text(text: &str) {
    assert!(!text.contains('<'));
    let mut parts = text.split('&');
    parts.next();
    for p in parts {
        assert!(
            ["amp;", "lt;", "gt;", "quot;", "apos;"]
                .iter()
                .any(|e| p.starts_with(e)),
            "a bare & in {text:?}"
        );
    }
}

/// The fields of one CSV line, as the `csv` crate reads them.
pub fn csv_fields(line: &str) -> Vec<String> {
    let mut reader = ::csv::ReaderBuilder::new()
        .has_headers(false)
        .from_reader(line.as_bytes());
    let record = reader
        .records()
        .next()
        .expect("a CSV record")
        .expect("valid CSV");
    record.iter().map(str::to_owned).collect()
}

/// One `<text>` of an SVG as plotters writes it.
#[derive(Debug, Clone)]
pub struct SvgText {
    pub x: f64,
    pub y: f64,
    /// `start`, `middle` or `end`.
    pub anchor: String,
    pub size: f64,
    /// Turned a quarter (a y axis title).
    pub rotated: bool,
    /// As written in the SVG (escaped), trimmed.
    pub text: String,
}

/// Average glyph width of sans-serif text, as a share of its size: what
/// a viewer's fonts take, give or take, for judging where text lands.
const GLYPH_WIDTH: f64 = 0.55;

impl SvgText {
    /// The box the text covers, (left, top, right, bottom), turned with
    /// the text when it is rotated.
    pub fn bounds(&self) -> (f64, f64, f64, f64) {
        let length = self.text.chars().count() as f64 * self.size * GLYPH_WIDTH;
        let (before, after) = match self.anchor.as_str() {
            "middle" => (length / 2.0, length / 2.0),
            "end" => (length, 0.0),
            _ => (0.0, length),
        };
        if self.rotated {
            // Read bottom to top: the text's start is at the bottom.
            (
                self.x - self.size,
                self.y - after,
                self.x + self.size,
                self.y + before,
            )
        } else {
            (
                self.x - before,
                self.y - self.size,
                self.x + after,
                self.y + self.size * 0.3,
            )
        }
    }
}

fn attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let start = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    let len = tag[start..].find('"')?;
    Some(&tag[start..start + len])
}

/// Every `<text>` of `svg`, with its baseline where plotters' `dy` puts
/// it (`0.76em`: hung from the top, `0.5ex`: centred, `-0.5ex`: on the
/// bottom).
pub fn svg_texts(svg: &str) -> Vec<SvgText> {
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(open) = rest.find("<text ") {
        let close = rest[open..].find('>').expect("a tag closes") + open;
        let end = rest[close..].find("</text>").expect("a text closes") + close;
        let tag = &rest[open..close];
        let number = |name: &str| -> f64 {
            attribute(tag, name)
                .unwrap_or_else(|| panic!("no {name} in {tag}"))
                .parse()
                .unwrap_or_else(|e| panic!("{name} in {tag}: {e}"))
        };
        let size = number("font-size");
        let shift = match attribute(tag, "dy") {
            Some("0.76em") => 0.76 * size,
            Some("0.5ex") => 0.25 * size,
            Some("-0.5ex") => -0.25 * size,
            _ => 0.0,
        };
        let rotated = attribute(tag, "transform")
            .is_some_and(|t| t.starts_with("rotate(270") || t.starts_with("rotate(-90"));
        let (x, y) = (number("x"), number("y"));
        out.push(SvgText {
            // A turned text's baseline moves along x, not y.
            x: if rotated { x + shift } else { x },
            y: if rotated { y } else { y + shift },
            anchor: attribute(tag, "text-anchor").unwrap_or("start").to_owned(),
            size,
            rotated,
            text: rest[close + 1..end].trim().to_owned(),
        });
        rest = &rest[end..];
    }
    out
}

/// The texts of `svg`'s `<text>` elements, in order.
pub fn svg_labels(svg: &str) -> Vec<String> {
    svg_texts(svg).into_iter().map(|t| t.text).collect()
}

/// The canvas size of `svg`.
pub fn svg_size(svg: &str) -> (f64, f64) {
    let open = svg.find("<svg ").expect("an svg element");
    let tag = &svg[open..open + svg[open..].find('>').expect("it closes")];
    let get = |name: &str| {
        attribute(tag, name)
            .expect(name)
            .parse::<f64>()
            .expect(name)
    };
    (get("width"), get("height"))
}

/// Checks that every text of `svg` lies on its canvas and that no two
/// texts cover one another (as a viewer would draw them, give or take).
#[track_caller]
pub fn assert_text_fits(svg: &str) {
    let (width, height) = svg_size(svg);
    let texts: Vec<(SvgText, (f64, f64, f64, f64))> = svg_texts(svg)
        .into_iter()
        .filter(|t| !t.text.is_empty())
        .map(|t| {
            let b = t.bounds();
            (t, b)
        })
        .collect();
    for (t, (l, top, r, bottom)) in &texts {
        assert!(
            *l >= 0.0 && *top >= 0.0 && *r <= width && *bottom <= height,
            "{t:?} runs off the {width}x{height} canvas"
        );
    }
    for (i, (a, (al, at, ar, ab))) in texts.iter().enumerate() {
        for (b, (bl, bt, br, bb)) in &texts[i + 1..] {
            let apart = ar <= bl || br <= al || ab <= bt || bb <= at;
            assert!(apart, "{a:?}\n  overlaps\n{b:?}");
        }
    }
}
