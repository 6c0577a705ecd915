//! Teardown after a set-up step fails half-way leaks nothing: the kernel's
//! own resource counts (`rdma resource show`) and this process's open file
//! descriptors return to where they started.
//!
//! Its own test binary, so nothing else in this process holds verbs
//! resources while it counts; the one test inside runs the cases in order.

use std::net::SocketAddr;

use pinpoll::connect::cm::{Connector, Listener};
use pinpoll::connect::oob::Prepared;
use pinpoll::device::Device;
use pinpoll::{Access, Error, PageSize};
use pinpoll_testkit::pair::{config, pair, Method};
use pinpoll_testkit::{cm_addr, device};

/// (pd, cq, qp, cm_id, mr, ctx) of `device`, as the kernel counts them.
fn kernel_counts(device: &str) -> [u64; 6] {
    let out = std::process::Command::new("rdma")
        .args(["-j", "resource", "show"])
        .output()
        .expect("run `rdma -j resource show` (iproute2)");
    assert!(
        out.status.success(),
        "rdma resource show failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("rdma -j prints JSON");
    let dev = all
        .as_array()
        .and_then(|a| a.iter().find(|d| d["ifname"] == device))
        .unwrap_or_else(|| panic!("{device} not in {all}"));
    ["pd", "cq", "qp", "cm_id", "mr", "ctx"]
        .map(|k| dev[k].as_u64().unwrap_or_else(|| panic!("no {k} in {dev}")))
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count()
}

fn assert_released(device: &str, case: &str, before: ([u64; 6], usize)) {
    assert_eq!(
        kernel_counts(device),
        before.0,
        "{case}: verbs resources (pd, cq, qp, cm_id, mr, ctx) leaked"
    );
    assert_eq!(open_fds(), before.1, "{case}: file descriptors leaked");
}

#[test]
#[ignore = "needs an RDMA device"]
fn failed_setups_release_everything_they_created() {
    let dev = device();
    // Warm up librdmacm's and libibverbs' process-wide state (device list,
    // cached contexts) so that what follows is measured against it.
    {
        let listener = Listener::bind(cm_addr()).unwrap();
        drop(listener);
        drop(Device::open(Some(&dev)).unwrap());
    }
    let baseline = (kernel_counts(&dev), open_fds());

    // 1. Context, PD, CQs and QP exist, and a region is registered; then
    //    mapping the next one fails (more 1 GiB pages than any machine
    //    reserves).
    for _ in 0..20 {
        let mut prepared = Prepared::new(Some(&dev), &config(), Access::REMOTE_WRITE).unwrap();
        let ep = prepared.endpoint();
        let first = ep.register_shared(4096, PageSize::Base, false).unwrap();
        let err = ep
            .register(64 << 30, PageSize::Huge1G, Access::LOCAL_WRITE)
            .unwrap_err();
        assert!(matches!(err, Error::Map { .. }), "{err}");
        drop(first);
    }
    assert_released(&dev, "failed registration", baseline);

    // 2. QP creation fails after the PD and CQs exist (more WRs than the
    //    device allows).
    let limit = Device::open(Some(&dev))
        .unwrap()
        .query_device()
        .unwrap()
        .max_qp_wr;
    if limit < 1 << 16 {
        for _ in 0..20 {
            let cfg = {
                let mut built = config();
                built.max_send_wr = limit + 1;
                built
            };
            let err = Prepared::new(Some(&dev), &cfg, Access::REMOTE_WRITE).unwrap_err();
            assert!(matches!(err, Error::CreateQp { .. }), "{err}");
        }
        assert_released(&dev, "failed QP creation", baseline);
    }

    // 3. rdma_cm: address and route resolved, endpoint built, then the
    //    connect is rejected because nobody listens on that port.
    for _ in 0..10 {
        let mut addr: SocketAddr = cm_addr();
        addr.set_port(1); // nothing listens on port 1
        let conn = Connector::resolve(addr, &config()).unwrap();
        let err = conn.connect(&[]).unwrap_err();
        assert!(
            matches!(err, Error::Rejected { .. } | Error::CmEvent { .. }),
            "{err}"
        );
    }
    assert_released(&dev, "rejected connect", baseline);

    // 4. A full connection, used, then dropped with memory still registered.
    for method in [Method::Cm, Method::Oob] {
        let (client, server) = pair(method);
        drop(client);
        drop(server);
        assert_released(&dev, &format!("connected pair ({method:?})"), baseline);
    }

    // 5. The parents dropped before their child: a region outlives the
    //    endpoint (QP, CQs, PD handle, context) it was registered on; its
    //    Arc keeps the PD, and the PD the context.
    let mut prepared = Prepared::new(Some(&dev), &config(), Access::REMOTE_WRITE).unwrap();
    let mut mr = prepared
        .endpoint()
        .register(8192, PageSize::Base, Access::LOCAL_WRITE)
        .unwrap();
    drop(prepared);
    mr.as_mut_slice()[8191] = 7;
    assert_eq!(mr.as_slice()[8191], 7);
    drop(mr);
    assert_released(&dev, "child outliving its parent handle", baseline);

    // 6. A connect request comes while the server has no descriptor to
    //    spare: taking it fails (EMFILE) before the request is taken, so
    //    it is neither lost nor leaked, and is accepted once the server can.
    //    Before, the request was taken first and then dropped unanswered.
    let listener = Listener::bind(cm_addr()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (resolved, client_ready) = std::sync::mpsc::channel();
    let client = std::thread::spawn(move || {
        let connector = Connector::resolve(addr, &config()).unwrap();
        resolved.send(()).unwrap();
        connector.connect(&[])
    });
    client_ready.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let err = with_no_descriptor_to_spare(|| {
        listener
            .next_request(&config(), std::time::Duration::from_secs(10))
            .unwrap_err()
    });
    assert!(
        err.to_string().contains("rdma_create_event_channel"),
        "{err}"
    );
    let request = listener
        .next_request(&config(), std::time::Duration::from_secs(10))
        .expect("the request waited for the server");
    let server = request.accept(&[]).expect("accept");
    let client = client.join().unwrap().expect("the client got in");
    drop((client, server, listener));
    assert_released(&dev, "a request taken while out of descriptors", baseline);
}

/// Runs `f` with this process's descriptor limit at the lowest free
/// descriptor, so that opening one more fails with EMFILE. A helper shell
/// (util-linux `prlimit`) lowers it and puts it back: putting it back
/// from here would itself need a descriptor.
fn with_no_descriptor_to_spare<T>(f: impl FnOnce() -> T) -> T {
    use std::io::{BufRead, Write};
    use std::process::{Command, Stdio};
    let me = std::process::id();
    let script = format!(
        "read low; old=$(prlimit --pid {me} --nofile --output SOFT --noheadings); \
         prlimit --pid {me} --nofile=$low: && echo lowered; read go; \
         prlimit --pid {me} --nofile=$old:"
    );
    let mut helper = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("sh");
    let mut to_helper = helper.stdin.take().unwrap();
    let mut from_helper = std::io::BufReader::new(helper.stdout.take().unwrap());
    // The listing's own descriptor is listed too, and free again after.
    let listing = std::path::PathBuf::from(format!("/proc/{me}/fd"));
    let open: std::collections::BTreeSet<usize> = std::fs::read_dir(&listing)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| std::fs::read_link(e.path()).ok().as_ref() != Some(&listing))
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    let lowest_free = (0..).find(|fd| !open.contains(fd)).unwrap();
    writeln!(to_helper, "{lowest_free}").unwrap();
    let mut line = String::new();
    from_helper.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "lowered", "prlimit could not lower the limit");
    let out = f();
    writeln!(to_helper, "go").unwrap();
    assert!(
        helper.wait().unwrap().success(),
        "prlimit put the limit back"
    );
    out
}
