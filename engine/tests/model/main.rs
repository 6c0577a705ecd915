//! The public API driven by a model, on a real rxe pair.
//!
//! Seeded random sequences of operations ([`gen`]) run against both
//! styles of the API at once — an [`pinpoll::Endpoint`] with whole
//! regions posted, completed with long and short waits, dropped; and a
//! [`pinpoll::Connection`] with batches (posted and dropped), lent
//! regions, polls, reclaims and waits — and both are closed and connected
//! again now and then. All the while the peer ([`peer`]) RDMA-WRITEs into
//! this side's exposed memory and sends whenever it may.
//!
//! A reference model ([`spec`]) predicts every outcome: the completion
//! each `complete` must meet, each push's sequence number or refusal,
//! each event; a region is recognised by its memory when it comes back,
//! from where it went, exactly once. Every region safe code holds is
//! stamped with a canary ([`canary`]) and checked after every step: no
//! DMA may change a byte of it. A failing sequence is cut down to a short
//! one ([`shrink`]) and printed with its seed.
//!
//! `PINPOLL_MODEL_SEED` (default: from the clock, printed) picks the
//! sequences, `PINPOLL_MODEL_RUNS` how many (default 10) and
//! `PINPOLL_MODEL_STEPS` their length (default 1000): a failure prints the
//! settings that run its sequence again. `PINPOLL_MODEL_SHRINK_SECS`
//! bounds the shrinking (default 300).

mod bytes;
mod canary;
mod connection;
mod endpoint;
mod gen;
mod peer;
mod rig;
mod shrink;
mod spec;

use std::time::{Duration, Instant};

use rig::{Failure, Tally};

fn setting(var: &str, default: u64) -> u64 {
    match std::env::var(var) {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("{var}={v:?}: {e}"))
        }
        Err(_) => default,
    }
}

fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

#[test]
#[ignore = "needs an RDMA device"]
fn the_public_api_does_what_its_model_predicts() {
    let _serial = pinpoll_testkit::serial();
    let seed = setting("PINPOLL_MODEL_SEED", clock_seed());
    let runs = setting("PINPOLL_MODEL_RUNS", 10);
    let steps = setting("PINPOLL_MODEL_STEPS", 1000) as usize;
    let shrink_budget = Duration::from_secs(setting("PINPOLL_MODEL_SHRINK_SECS", 300));
    println!("model: seed {seed:#x}, {runs} sequences of {steps} steps");
    let start = Instant::now();
    let mut total = Tally::default();
    for i in 0..runs {
        let seq_seed = seed.wrapping_add(i);
        let ops = gen::sequence(seq_seed, steps);
        match rig::run(seq_seed, &ops) {
            Ok(tally) => total.add(&tally),
            Err(failure) => report(seq_seed, steps, &ops, failure, shrink_budget),
        }
    }
    let elapsed = start.elapsed();
    let time = std::mem::take(&mut total.time);
    println!("model: {} steps in {elapsed:.1?}: {total:?}", total.steps);
    for (op, (n, t)) in time {
        println!("model: {n:6} x {op:<14} {t:.1?}");
    }
    // The run went where it should: every path the model judges was met.
    let reached = [
        ("completions", total.completed),
        ("timed-out completes", total.timed_out),
        (
            "completions met by another request's complete",
            total.other_completion,
        ),
        ("completions handed over later", total.kept_handed_over),
        ("dropped requests", total.dropped),
        (
            "parked regions freed by their completion",
            total.parked_freed,
        ),
        ("refused posts", total.refused_posts),
        ("messages received", total.messages_in),
        ("READs checked", total.reads),
        ("batches posted", total.batches_posted),
        ("batches dropped", total.batches_dropped),
        ("refused pushes", total.refused_pushes),
        ("lent regions reclaimed", total.reclaimed),
    ];
    let missed: Vec<&str> = reached
        .iter()
        .filter(|(_, n)| *n == 0)
        .map(|(what, _)| *what)
        .collect();
    assert!(
        missed.is_empty() || runs * (steps as u64) < 2000,
        "the sequences never reached: {missed:?}"
    );
}

/// Shrinks a failing sequence, prints it with how to run it again, and fails.
fn report(seed: u64, steps: usize, ops: &[gen::Op], failure: Failure, budget: Duration) -> ! {
    println!(
        "model: sequence {seed:#x} failed at step {}: {}",
        failure.step, failure.what
    );
    println!("model: shrinking (up to {budget:?})");
    let (minimal, last) = shrink::shrink(ops, failure.clone(), budget, |candidate| {
        rig::run(seed, candidate).err()
    });
    println!("model: {} operations still fail:", minimal.len());
    for (i, op) in minimal.iter().enumerate() {
        println!("model: step {i}: {op:?}");
    }
    panic!(
        "the API broke the model at step {} of sequence {seed:#x}: {}\n\
         shrunk to {} operations (above), failing with: {}\n\
         run it again: PINPOLL_MODEL_SEED={seed:#x} PINPOLL_MODEL_RUNS=1 PINPOLL_MODEL_STEPS={steps}",
        failure.step,
        failure.what,
        minimal.len(),
        last.what
    );
}
