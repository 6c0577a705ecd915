//! Shared set-up of the criterion benches: finding an RDMA device (or
//! explaining in one line how to get one), pinning, and the in-process
//! pair each device bench measures, built from `pinpoll-perf`'s loops.
#![forbid(unsafe_code)]

use std::time::Duration;

use pinpoll::EngineConfig;
use pinpoll_perf::session::{pin, Loopback};
use pinpoll_perf::{data_config, Kind, Mode, Overrides, Plan};

/// The device to run on: `$PINPOLL_DEVICE` (as every test finds it, set
/// in the SoftRoCE guest where scripts/test.sh runs the device benches),
/// else the first one found. `None` after printing one line saying how to
/// get one: `cargo bench` on a host without a NIC succeeds, measuring
/// nothing on the device.
pub fn device(bench: &str) -> Option<String> {
    if let Some(d) = pinpoll_testkit::env::device_if_set() {
        return Some(d);
    }
    match pinpoll::device::list_devices() {
        Ok(list) if !list.is_empty() => Some(list[0].name.clone()),
        _ => {
            println!(
                "{bench}: skipped, no RDMA device: run `scripts/softroce-vm -- cargo bench -p pinpoll-benches` \
                 (SoftRoCE in a throwaway guest), or `scripts/softroce.sh up` on an rxe-capable kernel"
            );
            None
        }
    }
}

/// Cores of this process.
pub fn cores() -> usize {
    pinpoll_perf::available_cores()
}

/// The server thread's core.
pub const SERVER_CORE: usize = 0;

/// The client's busy core (the measuring thread in direct mode, the
/// worker in engine mode): 1 when there are two or more.
pub fn client_core() -> usize {
    usize::from(cores() > 1)
}

/// Pins the calling (measuring) thread for direct mode.
pub fn pin_measuring_thread() {
    if let Err(e) = pin(client_core()) {
        eprintln!("warning: {e:#}; measuring unpinned");
    }
}

/// The configuration of one bench: the profile for the kind, sized for
/// `size`, with the worker pinned in engine mode.
pub fn config(kind: Kind, mode: Mode, size: usize, inline: Option<u32>) -> EngineConfig {
    let base = EngineConfig::load(kind.default_profile())
        .unwrap_or_else(|e| panic!("tuning profile {}: {e}", kind.default_profile()));
    let o = Overrides {
        inline_size: inline,
        timeout: Some(Duration::from_secs(30)),
        ..Overrides::default()
    };
    let mut cfg =
        data_config(&base, kind, size, &o).unwrap_or_else(|e| panic!("configuration: {e}"));
    if mode == Mode::Engine {
        cfg.core = Some(client_core());
    }
    cfg
}

/// Connects a pair for `kind` at `size` bytes and starts its server.
pub fn pair(device: &str, kind: Kind, mode: Mode, size: usize, cfg: &EngineConfig) -> Loopback {
    let plan = Plan::new(kind, mode, size, cfg.qp.max_recv_wr);
    Loopback::start(plan, cfg, Some(device), Some(SERVER_CORE))
        .unwrap_or_else(|e| panic!("{} {} B ({}): {e:#}", kind.name(), size, mode.name()))
}
