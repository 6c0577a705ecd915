//! A port that goes down under a connection: the device's asynchronous
//! event (PORT_ERR) ends the wait with a typed error naming it, and once the
//! port is back a new connection works. Its own test binary because it
//! takes the guest's RDMA netdev down and up (scripts/softroce-vm runs the
//! binaries one after another).

use std::process::Command;
use std::time::{Duration, Instant};

use pinpoll::device::Device;
use pinpoll::Error;
use pinpoll_testkit::pair::{engine_config, oob_pair};
use pinpoll_testkit::{addr6, device, netdev};

fn ip(args: &[&str]) {
    let status = Command::new("ip")
        .args(args)
        .status()
        .expect("run ip (iproute2)");
    assert!(status.success(), "ip {args:?} failed");
}

/// Link down drops the netdev's IPv6 link-local address (which
/// scripts/softroce-vm set by hand, without DAD): put it back.
fn restore_link_local(netdev: &str) {
    let addr6 = addr6();
    let ip6 = addr6.split('%').next().unwrap_or(&addr6);
    let out = Command::new("ip")
        .args([
            "-6",
            "addr",
            "replace",
            &format!("{ip6}/64"),
            "dev",
            netdev,
            "nodad",
        ])
        .output()
        .expect("ip addr replace");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Until the port is ACTIVE and the netdev's addresses are usable again.
fn wait_until_back(dev: &str, netdev: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let active = Device::open(Some(dev))
            .and_then(|c| c.query_port(1))
            .is_ok_and(|p| p.is_active());
        let addrs = Command::new("ip")
            .args(["-6", "addr", "show", "dev", netdev])
            .output()
            .expect("ip addr");
        let text = String::from_utf8_lossy(&addrs.stdout);
        if active && text.contains("fe80") && !text.contains("tentative") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{dev} did not come back: active={active}, {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs an RDMA device"]
fn a_port_going_down_ends_waits_with_the_device_event() {
    let (dev, netdev) = (device(), netdev());
    let mut cfg = engine_config();
    // Heartbeats off: the port event alone must end the wait.
    cfg.heartbeat_interval = None;
    cfg.completion_timeout = Duration::from_secs(30);
    let (mut client, _server) = oob_pair(&cfg);

    ip(&["link", "set", &netdev, "down"]);
    let err = client.recv().unwrap_err();
    ip(&["link", "set", &netdev, "up"]);
    restore_link_local(&netdev);
    wait_until_back(&dev, &netdev);
    match &err {
        Error::DeviceEvent { device, event } => {
            assert_eq!(
                (device.as_str(), *event),
                (dev.as_str(), "PORT_ERR"),
                "{err}"
            );
        }
        other => panic!("expected the PORT_ERR device event, got {other}"),
    }
    assert!(err.to_string().contains("ibv_devinfo"), "{err}");

    // The port is back: a new connection moves data again.
    let (mut client, mut server) = oob_pair(&cfg);
    client.send(b"after the outage").unwrap();
    assert_eq!(server.recv().unwrap().data, b"after the outage");
}
