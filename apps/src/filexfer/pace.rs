//! The server's bound on a slow client: a transfer must keep `--min-rate`
//! bytes per second over every window of [`WINDOW`], and end within
//! `--deadline`. Without it a client trickling one chunk just inside
//! `--timeout` would hold a transfer slot and a full-size reservation for
//! as long as it liked.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The span the rate is measured over: long enough that a short stall (a
/// paused process, a burst of retransmissions) is averaged out.
pub const WINDOW: Duration = Duration::from_secs(10);

/// A transfer's pace, shared by its streams' threads.
#[derive(Debug)]
pub struct Pace {
    /// Bytes per second over a window; 0: no bound.
    min_rate: u64,
    /// `None`: no bound.
    deadline: Option<Duration>,
    started: Instant,
    state: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    began: Instant,
    /// Bytes received before the window began.
    before: u64,
    /// Bytes received so far.
    total: u64,
}

/// Why a transfer was ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooSlow {
    #[error(
        "the transfer fell below --min-rate: {got} bytes/s over the last {secs} s, \
         at least {min} required"
    )]
    Rate { got: u64, min: u64, secs: u64 },
    #[error("the transfer took longer than --deadline {secs} s")]
    Deadline { secs: u64 },
}

impl Pace {
    /// A pace starting now; `min_rate` 0 and `deadline` 0 disable a bound.
    pub fn new(min_rate: u64, deadline: Duration) -> Self {
        Self::starting_at(min_rate, deadline, Instant::now())
    }

    pub(crate) fn starting_at(min_rate: u64, deadline: Duration, now: Instant) -> Self {
        Pace {
            min_rate,
            deadline: (!deadline.is_zero()).then_some(deadline),
            started: now,
            state: Mutex::new(Window {
                began: now,
                before: 0,
                total: 0,
            }),
        }
    }

    /// Records `bytes` that arrived and checks both bounds.
    pub fn arrived(&self, bytes: u64) -> Result<(), TooSlow> {
        self.arrived_at(bytes, Instant::now())
    }

    pub(crate) fn arrived_at(&self, bytes: u64, now: Instant) -> Result<(), TooSlow> {
        if let Some(deadline) = self.deadline {
            if now.duration_since(self.started) > deadline {
                return Err(TooSlow::Deadline {
                    secs: deadline.as_secs(),
                });
            }
        }
        // A poisoned lock only means another stream panicked; the counts
        // are still whole numbers.
        let mut w = self.state.lock().unwrap_or_else(|e| e.into_inner());
        w.total += bytes;
        let span = now.duration_since(w.began);
        if self.min_rate == 0 || span < WINDOW {
            return Ok(());
        }
        let got = ((w.total - w.before) as f64 / span.as_secs_f64()) as u64;
        if got < self.min_rate {
            return Err(TooSlow::Rate {
                got,
                min: self.min_rate,
                secs: span.as_secs(),
            });
        }
        w.began = now;
        w.before = w.total;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHUNK: u64 = 256 * 1024;

    #[test]
    fn a_steady_transfer_passes_every_window() {
        let t0 = Instant::now();
        let pace = Pace::starting_at(1 << 20, Duration::from_secs(3600), t0);
        for ms in (0..60_000).step_by(100) {
            // 256 KiB every 100 ms: 2.5 MiB/s.
            let at = t0 + Duration::from_millis(ms);
            assert_eq!(pace.arrived_at(CHUNK, at), Ok(()), "at {ms} ms");
        }
    }

    /// One chunk every 9 s stays inside a 10 s --timeout but is ~29 KB/s:
    /// cut at the first chunk after a whole window.
    #[test]
    fn a_trickle_is_cut_after_one_window() {
        let t0 = Instant::now();
        let pace = Pace::starting_at(64 * 1024, Duration::ZERO, t0);
        assert_eq!(pace.arrived_at(CHUNK, t0 + Duration::from_secs(9)), Ok(()));
        let err = pace
            .arrived_at(CHUNK, t0 + Duration::from_secs(18))
            .unwrap_err();
        assert_eq!(
            err,
            TooSlow::Rate {
                got: 2 * CHUNK / 18,
                min: 64 * 1024,
                secs: 18
            }
        );
        assert!(err.to_string().contains("--min-rate"), "{err}");
    }

    /// A pause shorter than a window is averaged out by the bytes around it.
    #[test]
    fn a_short_stall_is_averaged_out() {
        let t0 = Instant::now();
        let pace = Pace::starting_at(1 << 20, Duration::ZERO, t0);
        for s in 0..4 {
            for k in 0..10 {
                let at = t0 + Duration::from_secs(s) + Duration::from_millis(100 * k);
                pace.arrived_at(CHUNK, at).unwrap();
            }
        }
        // Stopped for 5 s, then going on: 40 chunks (10 MiB) in 10 s.
        assert_eq!(pace.arrived_at(CHUNK, t0 + Duration::from_secs(10)), Ok(()));
    }

    #[test]
    fn zero_disables_both_bounds() {
        let t0 = Instant::now();
        let pace = Pace::starting_at(0, Duration::ZERO, t0);
        assert_eq!(
            pace.arrived_at(1, t0 + Duration::from_secs(1 << 20)),
            Ok(())
        );
    }

    #[test]
    fn the_deadline_ends_even_a_fast_transfer() {
        let t0 = Instant::now();
        let pace = Pace::starting_at(0, Duration::from_secs(30), t0);
        assert_eq!(pace.arrived_at(CHUNK, t0 + Duration::from_secs(29)), Ok(()));
        assert_eq!(
            pace.arrived_at(CHUNK, t0 + Duration::from_secs(31)),
            Err(TooSlow::Deadline { secs: 30 })
        );
    }
}
