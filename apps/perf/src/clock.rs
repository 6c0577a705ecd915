//! A cheap clock for per-iteration timestamps and our own bounded waits.
//!
//! `Instant::now()` is `clock_gettime`, which the vDSO answers without a
//! system call where the kernel's clocksource is the TSC — but in the TCG
//! guest the clocksource is the HPET, and every call is a system call plus
//! an emulated device read, a sizeable share of a round trip. perftest reads the TSC (`get_cycles`); so do we, on
//! x86_64, calibrated once against `Instant`. Elsewhere this is `Instant`.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Ticks of the clock (TSC cycles on x86_64, nanoseconds elsewhere).
#[inline]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        tick_counter::x86_64_tick_counter()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static EPOCH: OnceLock<Instant> = OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

static SCALE: OnceLock<f64> = OnceLock::new();

/// Nanoseconds per tick, measured once (about 20 ms of spinning) on first
/// use. Call it before any timed region: the first call inside one would
/// land those 20 ms in a sample or a bandwidth figure.
pub fn ns_per_tick() -> f64 {
    *SCALE.get_or_init(calibrate)
}

/// Whether [`ns_per_tick`] has been measured in this process.
pub fn is_calibrated() -> bool {
    SCALE.get().is_some()
}

fn calibrate() -> f64 {
    if !cfg!(target_arch = "x86_64") {
        return 1.0;
    }
    let mut best = f64::NAN;
    // Three tries; keep the median-ish (the one nearest the others).
    let mut tries = [0f64; 3];
    for t in &mut tries {
        let (i0, c0) = (Instant::now(), ticks());
        while i0.elapsed() < Duration::from_millis(7) {
            std::hint::spin_loop();
        }
        let (c1, i1) = (ticks(), Instant::now());
        let cycles = c1.saturating_sub(c0).max(1) as f64;
        *t = (i1 - i0).as_nanos() as f64 / cycles;
    }
    tries.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    if tries[1].is_finite() && tries[1] > 0.0 {
        best = tries[1];
    }
    if best.is_nan() {
        1.0
    } else {
        best
    }
}

/// Converts a tick count to a duration.
#[inline]
pub fn to_duration(ticks: u64) -> Duration {
    Duration::from_nanos((ticks as f64 * ns_per_tick()) as u64)
}

/// Converts a duration to ticks (for deadlines).
pub fn from_duration(d: Duration) -> u64 {
    (d.as_nanos() as f64 / ns_per_tick()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance_and_conversions_round_trip() {
        // No rate check against the OS clock: that is a timing assertion,
        // and under TCG the emulated counter's rate drifts with load.
        let t0 = ticks();
        std::thread::sleep(Duration::from_millis(5));
        assert!(ticks() > t0, "the tick counter advances");
        let second = from_duration(Duration::from_secs(1));
        assert!(second > 0);
        let back = to_duration(second).as_secs_f64();
        assert!(
            (back - 1.0).abs() < 1e-6,
            "1 s -> {second} ticks -> {back} s"
        );
    }
}
