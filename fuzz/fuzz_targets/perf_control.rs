//! pinpoll-perf's control messages (`control::decode`), as a server takes
//! a client's measurement (and a client the server's answers), then the
//! server's admission of the parameters (`Limits::admit`). A message
//! accepted round-trips through its encoder, its parameters are in range,
//! and what the server admits is a valid configuration within the
//! registered memory and the wait it allows.
//!
//! Inputs that do not start with `{` (no recorded message does) also build
//! a `Params` field by field, sent as the client's encoder writes it: a
//! mutated number in JSON text rarely stays a number in range, while a
//! field taken from the input's bytes reaches every edge of the server's
//! checks.
#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use pinpoll::EngineConfig;
use pinpoll_fuzz::within_budget;
use pinpoll_perf::admit::{pinned_bytes, Limits};
use pinpoll_perf::control::{self, printable, Msg, MAX_MSG};
use pinpoll_perf::plan::{WireConfig, MAX_ITERS, MAX_SIZE, MAX_TIMEOUT_MS};
use pinpoll_perf::{Kind, Mode, Params};

/// The server's own bound on every wait (its `--timeout`).
const SERVER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a server of `kind` with its default profile allows, and its base
/// configuration, as `pinpoll-perf KIND` without flags sets them up.
fn server(kind: Kind) -> &'static (Limits, EngineConfig) {
    static SERVERS: OnceLock<Vec<(Limits, EngineConfig)>> = OnceLock::new();
    let servers = SERVERS.get_or_init(|| {
        Kind::ALL
            .iter()
            .map(|&k| {
                let mut base = EngineConfig::load(k.default_profile()).expect("a built-in profile");
                base.completion_timeout = SERVER_TIMEOUT;
                base.qp.connect_timeout = SERVER_TIMEOUT;
                let limits = Limits::new(k, &base, k.default_profile(), None, SERVER_TIMEOUT)
                    .expect("the limits of a built-in profile");
                (limits, base)
            })
            .collect()
    });
    let at = Kind::ALL
        .iter()
        .position(|k| *k == kind)
        .expect("every kind");
    &servers[at]
}

fn admitted(params: &Params) {
    params
        .check()
        .expect("decode admits only checked parameters");
    let _ = params.plan();
    // A server of another test refuses it.
    let at = Kind::ALL
        .iter()
        .position(|k| *k == params.kind)
        .expect("a kind");
    let other = Kind::ALL[(at + 1) % Kind::ALL.len()];
    let (limits, base) = server(other);
    assert!(
        limits.admit(params, base).is_err(),
        "{other:?} server: {params:?}"
    );
    let (limits, base) = server(params.kind);
    let Ok(cfg) = within_budget("Limits::admit", 0, 0, || limits.admit(params, base)) else {
        return;
    };
    cfg.validate().expect("an admitted configuration is valid");
    // Everything the admitted run pins (rings rounded to their pages, and
    // the queues), not only the rings' bytes.
    assert!(
        pinned_bytes(&cfg) <= limits.max_registered,
        "{params:?}"
    );
    assert!(cfg.completion_timeout <= SERVER_TIMEOUT, "{params:?}");
    assert!(params.size <= cfg.slot_size as usize, "{params:?}");
}

/// A power of two up to `1 << max_shift` most of the time (the rings'
/// and queues' sizes must be), any value otherwise.
fn power_of_two(u: &mut Unstructured<'_>, max_shift: u32) -> Result<u32> {
    if u.ratio(3, 4)? {
        Ok(1 << u.int_in_range(0..=max_shift)?)
    } else {
        u.arbitrary()
    }
}

/// A measurement, every field from `u`, mostly around the ranges the
/// server accepts and just past their edges.
fn built(u: &mut Unstructured<'_>) -> Result<Params> {
    Ok(Params {
        kind: *u.choose(&Kind::ALL)?,
        mode: *u.choose(&[Mode::Direct, Mode::Engine])?,
        size: u.int_in_range(0..=MAX_SIZE + 1)?,
        iters: u.int_in_range(0..=MAX_ITERS + 1)?,
        warmup: u.int_in_range(0..=MAX_ITERS + 1)?,
        await_sends: u.arbitrary()?,
        config: WireConfig {
            send_depth: power_of_two(u, 17)?,
            recv_depth: power_of_two(u, 17)?,
            cq_depth: power_of_two(u, 18)?,
            batch_size: u.int_in_range(0..=1 << 10)?,
            signal_interval: u.int_in_range(0..=1 << 10)?,
            inline_threshold: u.int_in_range(0..=1 << 10)?,
            max_inline_data: u.int_in_range(0..=1 << 10)?,
            slot_size: 64 * u.int_in_range(0..=(1 << 24) + 1)?,
            slot_count: power_of_two(u, 21)?,
            hugepages: u.arbitrary()?,
            qp_timeout: u.arbitrary()?,
            retry_count: u.arbitrary()?,
            rnr_retry: u.arbitrary()?,
            max_rd_atomic: u.arbitrary()?,
            completion_timeout_ms: u.int_in_range(0..=MAX_TIMEOUT_MS + 1)?,
        },
    })
}

fuzz_target!(|bytes: &[u8]| {
    received(bytes);
    if bytes.first() != Some(&b'{') {
        if let Ok(params) = built(&mut Unstructured::new(bytes)) {
            let sent = control::encode(&Msg::Params(params)).expect("Params encode");
            received(&sent);
        }
    }
});

/// Checks what the server makes of `bytes` received.
fn received(bytes: &[u8]) {
    let decoded = within_budget("control::decode", bytes.len(), 64, || {
        control::decode(bytes)
    });
    let Ok(msg) = decoded else {
        return;
    };
    assert!(bytes.len() <= MAX_MSG);
    // The same message made one byte too long (JSON takes the trailing
    // blanks) is refused.
    let mut long = bytes.to_vec();
    long.resize(MAX_MSG + 1, b' ');
    assert!(
        control::decode(&long).is_err(),
        "{} bytes accepted",
        long.len()
    );
    let encoded = control::encode(&msg).expect("a decoded message encodes");
    assert_eq!(control::decode(&encoded).as_ref(), Ok(&msg));
    match &msg {
        Msg::Params(params) => admitted(params),
        Msg::Error { message } => {
            let shown = printable(message);
            assert!(
                !shown.chars().any(pinpoll_apps::run::needs_escape),
                "{shown:?}"
            );
        }
        _ => {}
    }
}
