//! The control messages a pinpoll-perf peer sends, decoded as the other
//! side decodes them: valid messages with random fields round-trip, and
//! every field out of its range, every unknown or missing field, every
//! wrong type and every truncation is an error — never a panic.

use pinpoll_perf::control::{decode, encode, Msg, MAX_MSG};
use pinpoll_perf::plan::{WireConfig, MAX_ITERS, MAX_SIZE, MAX_TIMEOUT_MS, MIN_ITERS};
use pinpoll_perf::{Kind, Mode, Params};
use proptest::prelude::*;
use serde_json::Value;

/// A power of two from 2^lo to 2^hi.
fn power_of_two(lo: u32, hi: u32) -> impl Strategy<Value = u32> {
    (lo..=hi).prop_map(|e| 1u32 << e)
}

/// A configuration `EngineConfig::validate` accepts, every field drawn
/// at random within the relations between them.
fn wire_config() -> impl Strategy<Value = WireConfig> {
    let queues = (2u32..=1 << 16, power_of_two(0, 16)).prop_flat_map(|(sq, rq)| {
        let least_cq = sq.max(rq);
        (Just(sq), Just(rq), least_cq..=1 << 20, 1..sq)
    });
    let batching =
        queues.prop_flat_map(|(sq, rq, cq, batch)| (Just((sq, rq, cq, batch)), 1..=sq - batch));
    let rings = batching.prop_flat_map(|(q, signal)| {
        let least = (q.3 + signal).next_power_of_two().trailing_zeros();
        (
            Just(q),
            Just(signal),
            power_of_two(least, 20),
            1u32..=1 << 24,
        )
    });
    let transport = (
        0u32..=4096,
        any::<bool>(),
        1u8..=31,
        0u8..=7,
        0u8..=6,
        1u8..=16,
        1..=MAX_TIMEOUT_MS,
    );
    (rings, transport).prop_flat_map(
        |(((sq, rq, cq, batch), signal, slots, slot_units), (inline, huge, t, r, rnr, rd, ms))| {
            (0..=inline).prop_map(move |threshold| WireConfig {
                send_depth: sq,
                recv_depth: rq,
                cq_depth: cq,
                batch_size: batch,
                signal_interval: signal,
                inline_threshold: threshold,
                max_inline_data: inline,
                slot_size: slot_units * 64,
                slot_count: slots,
                hugepages: huge,
                qp_timeout: t,
                retry_count: r,
                rnr_retry: rnr,
                max_rd_atomic: rd,
                completion_timeout_ms: ms,
            })
        },
    )
}

fn params() -> impl Strategy<Value = Params> {
    (
        prop::sample::select(Kind::ALL.to_vec()),
        prop::sample::select(vec![Mode::Direct, Mode::Engine]),
        MIN_ITERS..=MAX_ITERS,
        0..=MAX_ITERS,
        wire_config(),
        any::<bool>(),
    )
        .prop_flat_map(|(kind, mode, iters, warmup, mut config, wants_await)| {
            // Awaiting every send: a direct latency test signaling each.
            let await_sends = wants_await && kind.is_latency() && mode == Mode::Direct;
            if await_sends {
                config.signal_interval = 1;
            }
            let most = MAX_SIZE.min(config.slot_size as usize);
            (1..=most).prop_map(move |size| Params {
                kind,
                mode,
                size,
                iters,
                warmup,
                await_sends,
                config: config.clone(),
            })
        })
}

fn msg() -> impl Strategy<Value = Msg> {
    prop_oneof![
        params().prop_map(Msg::Params),
        any::<u64>().prop_map(|nonce| Msg::Ready { nonce }),
        Just(Msg::Done),
        any::<u64>().prop_map(|messages| Msg::Served { messages }),
        Just(Msg::End),
        // Any text, control characters included (JSON escapes them).
        "(?s).{0,300}".prop_map(|message| Msg::Error { message }),
    ]
}

/// One field of a valid `Params` set out of its range.
#[derive(Debug, Clone, Copy)]
enum Bad {
    SizeZero,
    SizeTooLarge,
    SizeOverSlot,
    ItersTooFew,
    ItersTooMany,
    WarmupTooMany,
    SendDepth(u32),
    RecvDepth(u32),
    CqBelowQueues,
    CqTooDeep,
    BatchZero,
    BatchOverQueue,
    SignalZero,
    SignalOverQueue,
    InlineOverMax,
    MaxInline(u32),
    SlotSize(u32),
    SlotCount(u32),
    SlotsUnderBatching,
    QpTimeout(u8),
    RetryCount(u8),
    RnrRetry(u8),
    MaxRdAtomic(u8),
    TimeoutMs(u64),
    AwaitSendsOnBandwidth,
    AwaitSendsInEngineMode,
    AwaitSendsUnsignaled(u32),
}

fn bad() -> impl Strategy<Value = Bad> {
    prop_oneof![
        Just(Bad::SizeZero),
        Just(Bad::SizeTooLarge),
        Just(Bad::SizeOverSlot),
        Just(Bad::ItersTooFew),
        Just(Bad::ItersTooMany),
        Just(Bad::WarmupTooMany),
        prop_oneof![Just(0u32), (1u32 << 16) + 1..].prop_map(Bad::SendDepth),
        prop_oneof![Just(0u32), (1u32 << 16) + 1.., 3u32..1 << 16]
            .prop_filter("not a power of two, or too deep", |d| !d.is_power_of_two()
                || *d > 1 << 16)
            .prop_map(Bad::RecvDepth),
        Just(Bad::CqBelowQueues),
        Just(Bad::CqTooDeep),
        Just(Bad::BatchZero),
        Just(Bad::BatchOverQueue),
        Just(Bad::SignalZero),
        Just(Bad::SignalOverQueue),
        Just(Bad::InlineOverMax),
        (4097u32..).prop_map(Bad::MaxInline),
        prop_oneof![0u32..64, (1u32 << 30) + 1.., any::<u32>()]
            .prop_filter("invalid slot size", |s| *s < 64
                || *s > 1 << 30
                || s % 64 != 0)
            .prop_map(Bad::SlotSize),
        any::<u32>()
            .prop_filter("invalid slot count", |c| !c.is_power_of_two()
                || *c > 1 << 20)
            .prop_map(Bad::SlotCount),
        Just(Bad::SlotsUnderBatching),
        prop_oneof![Just(0u8), 32u8..].prop_map(Bad::QpTimeout),
        (8u8..).prop_map(Bad::RetryCount),
        (7u8..).prop_map(Bad::RnrRetry),
        prop_oneof![Just(0u8), 17u8..].prop_map(Bad::MaxRdAtomic),
        prop_oneof![Just(0u64), MAX_TIMEOUT_MS + 1..].prop_map(Bad::TimeoutMs),
        Just(Bad::AwaitSendsOnBandwidth),
        Just(Bad::AwaitSendsInEngineMode),
        (2u32..).prop_map(Bad::AwaitSendsUnsignaled),
    ]
}

fn spoil(p: &mut Params, bad: Bad) {
    let c = &mut p.config;
    match bad {
        Bad::SizeZero => p.size = 0,
        Bad::SizeTooLarge => p.size = MAX_SIZE + 1,
        Bad::SizeOverSlot => {
            c.slot_size = 64;
            p.size = 65;
        }
        Bad::ItersTooFew => p.iters = MIN_ITERS - 1,
        Bad::ItersTooMany => p.iters = MAX_ITERS + 1,
        Bad::WarmupTooMany => p.warmup = MAX_ITERS + 1,
        Bad::SendDepth(d) => c.send_depth = d,
        Bad::RecvDepth(d) => c.recv_depth = d,
        Bad::CqBelowQueues => c.cq_depth = c.send_depth.max(c.recv_depth) - 1,
        Bad::CqTooDeep => c.cq_depth = (1 << 20) + 1,
        Bad::BatchZero => c.batch_size = 0,
        Bad::BatchOverQueue => c.batch_size = c.send_depth + 1,
        Bad::SignalZero => c.signal_interval = 0,
        Bad::SignalOverQueue => c.signal_interval = c.send_depth - c.batch_size + 1,
        Bad::InlineOverMax => {
            c.max_inline_data = c.max_inline_data.min(4095);
            c.inline_threshold = c.max_inline_data + 1;
        }
        Bad::MaxInline(m) => c.max_inline_data = m,
        Bad::SlotSize(s) => c.slot_size = s,
        Bad::SlotCount(n) => c.slot_count = n,
        // The largest power of two below batch + signal (at least 2).
        Bad::SlotsUnderBatching => {
            c.slot_count = (c.batch_size + c.signal_interval).next_power_of_two() / 2
        }
        Bad::QpTimeout(t) => c.qp_timeout = t,
        Bad::RetryCount(r) => c.retry_count = r,
        Bad::RnrRetry(r) => c.rnr_retry = r,
        Bad::MaxRdAtomic(r) => c.max_rd_atomic = r,
        Bad::TimeoutMs(ms) => c.completion_timeout_ms = ms,
        Bad::AwaitSendsOnBandwidth => {
            p.await_sends = true;
            p.kind = Kind::WriteBw;
        }
        Bad::AwaitSendsInEngineMode => {
            p.await_sends = true;
            p.kind = Kind::SendLat;
            p.mode = Mode::Engine;
        }
        Bad::AwaitSendsUnsignaled(n) => {
            p.await_sends = true;
            p.kind = Kind::WriteLat;
            p.mode = Mode::Direct;
            c.signal_interval = n;
        }
    }
}

/// The message as it travels, as JSON to edit.
fn json(msg: &Msg) -> Value {
    serde_json::from_slice(&encode(msg).unwrap()).unwrap()
}

/// Values no field of a message takes: negative, fractional, beyond
/// 64 bits, or of another type.
fn wrong_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        (i64::MIN..0).prop_map(Value::from),
        (0.5f64..1e6).prop_map(|f| Value::from(f + 0.25)),
        Just(serde_json::from_str("18446744073709551616").unwrap()),
        // No kind, mode or message type starts with `~`.
        ".{0,8}".prop_map(|s| Value::from(format!("~{s}"))),
        Just(Value::Null),
        Just(Value::Array(vec![])),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn valid_messages_round_trip(m in msg()) {
        let bytes = encode(&m).unwrap();
        prop_assert!(bytes.len() <= MAX_MSG);
        let back = decode(&bytes).unwrap();
        prop_assert_eq!(&back, &m);
        prop_assert_eq!(encode(&back).unwrap(), bytes);
    }

    #[test]
    fn every_field_out_of_range_is_refused(mut p in params(), bad in bad()) {
        spoil(&mut p, bad);
        let bytes = serde_json::to_vec(&Msg::Params(p)).unwrap();
        let err = decode(&bytes).unwrap_err();
        prop_assert!(err.to_string().starts_with("bad parameters "), "{:?}: {}", bad, err);
    }

    /// A field of another type or beyond its integer type, anywhere in
    /// the message (the parameters' configuration included).
    #[test]
    fn a_field_of_the_wrong_type_is_refused(
        m in msg(),
        pick in any::<prop::sample::Index>(),
        value in wrong_value(),
    ) {
        let mut v = json(&m);
        let mut fields: Vec<(bool, String)> = v.as_object().unwrap().keys()
            .filter(|k| *k != "type")
            .map(|k| (false, k.clone()))
            .collect();
        if let Some(config) = v.get("config").and_then(Value::as_object) {
            fields.extend(config.keys().map(|k| (true, k.clone())));
        }
        if fields.is_empty() {
            return Ok(());
        }
        let (nested, key) = pick.get(&fields).clone();
        if key == "message" && value.is_string() {
            return Ok(());
        }
        let target = if nested { &mut v["config"] } else { &mut v };
        target[&key] = value;
        let bytes = serde_json::to_vec(&v).unwrap();
        prop_assert!(decode(&bytes).is_err(), "{} = {} accepted", key, target_value(&v, nested, &key));
    }

    #[test]
    fn unknown_missing_and_mistyped_fields_are_refused(
        m in msg(),
        extra in "[a-z_]{1,12}",
        pick in any::<prop::sample::Index>(),
    ) {
        let v = json(&m);
        let mut with_extra = v.clone();
        prop_assume!(with_extra.get(&extra).is_none());
        with_extra[&extra] = Value::from(1);
        prop_assert!(decode(&serde_json::to_vec(&with_extra).unwrap()).is_err());
        let keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        let key = pick.get(&keys);
        let mut without = v.clone();
        without.as_object_mut().unwrap().remove(key);
        prop_assert!(decode(&serde_json::to_vec(&without).unwrap()).is_err(), "without {}", key);
        let mut other_type = v;
        other_type["type"] = Value::from(format!("{extra}-x"));
        prop_assert!(decode(&serde_json::to_vec(&other_type).unwrap()).is_err());
    }

    #[test]
    fn truncated_or_damaged_messages_are_errors(
        m in msg(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let bytes = encode(&m).unwrap();
        let short = &bytes[..cut.index(bytes.len())];
        prop_assert!(decode(short).is_err());
        let mut damaged = bytes.clone();
        damaged[flip.index(bytes.len())] = byte;
        // A damaged message may still be a valid one (a digit for a
        // digit); if it decodes, it is in range and round-trips.
        if let Ok(back) = decode(&damaged) {
            prop_assert_eq!(decode(&encode(&back).unwrap()).unwrap(), back);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode(&bytes);
    }
}

fn target_value(v: &Value, nested: bool, key: &str) -> String {
    if nested {
        v["config"][key].to_string()
    } else {
        v[key].to_string()
    }
}

#[test]
fn oversized_messages_are_refused_before_parsing() {
    let long = Msg::Error {
        message: "x".repeat(MAX_MSG),
    };
    assert!(encode(&long).is_err());
    let bytes = serde_json::to_vec(&long).unwrap();
    let err = decode(&bytes).unwrap_err().to_string();
    assert!(err.contains("too long (at most 4096)"), "{err}");
}
