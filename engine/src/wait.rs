//! Bounded busy-waits: every wait in pinpoll has a deadline, but reading
//! the clock costs more than an empty poll (a vDSO call on hardware, a
//! system call and an emulated timer read in a TCG guest), so it is read
//! only every [`SPINS_PER_CLOCK_CHECK`] turns — and never for a wait that
//! ends within the first of them, the common case on the fast path.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// Polls between two reads of the clock.
pub(crate) const SPINS_PER_CLOCK_CHECK: u32 = 64;

// Why the fast turns of a busy-poll have no `spin_loop()` (PAUSE): a
// completion is noticed only after the PAUSE ends, which on recent x86
// cores is over a hundred cycles, and a thread pinned alone to its core
// has no hyper-thread sibling for it to make room for. In a TCG guest each
// PAUSE even leaves the translated code to let another vCPU run. perftest,
// the yardstick, does not pause either. Waits that last yield or nap
// (below), and `IdlePolicy::Backoff` keeps its PAUSE for workers that
// share a core.

/// A wait that has lasted this long yields the CPU at every clock check.
/// By then what it waits for is the peer or the kernel's own work — on
/// SoftRoCE the packet processing itself, in softirq context that runs in
/// ksoftirqd under load — and a thread that only spins would starve it
/// whenever spinning threads outnumber cores (filexfer's server runs one
/// per client). A yield with nothing else runnable returns at once, and
/// the fast path, whose waits end sooner, never gets here.
pub(crate) const YIELD_AFTER: Duration = Duration::from_millis(1);

/// A wait that has lasted this long sleeps [`NAP`] at every clock check
/// instead: a yield only helps threads the scheduler would pick, and with
/// several spinners per core the kernel's work still waited its turn. The
/// wait then notices what it waits for at most a nap late — nothing next to
/// the 10 ms already spent.
pub(crate) const NAP_AFTER: Duration = Duration::from_millis(10);
pub(crate) const NAP: Duration = Duration::from_micros(50);

/// The instant `within` from now; a `within` past what the clock can hold
/// (a public `connect_timeout` of `Duration::MAX`) is as far as a century,
/// not a panic of `Instant + Duration`.
pub(crate) fn deadline_after(within: Duration) -> Instant {
    const FAR: Duration = Duration::from_secs(100 * 365 * 86_400);
    let now = Instant::now();
    now.checked_add(within)
        .or_else(|| now.checked_add(FAR))
        .unwrap_or(now)
}

/// One bounded wait for `what`.
#[derive(Debug)]
pub(crate) struct BoundedWait {
    /// Read at the first clock check, not at creation: a wait that ends
    /// sooner never touches the clock. The deadline is therefore late by
    /// at most one check interval (tens of polls).
    start: Option<Instant>,
    limit: Duration,
    spins: u32,
    what: &'static str,
}

impl BoundedWait {
    #[inline]
    pub(crate) fn new(limit: Duration, what: &'static str) -> BoundedWait {
        BoundedWait {
            start: None,
            limit,
            spins: 0,
            what,
        }
    }

    /// One more turn of the loop: `Ok(None)` to keep spinning, `Ok(Some(
    /// waited))` when the clock was read (the moment for slower checks),
    /// and a typed timeout once the limit has passed.
    #[inline]
    pub(crate) fn tick(&mut self) -> Result<Option<Duration>> {
        self.spins = self.spins.wrapping_add(1);
        if !self.spins.is_multiple_of(SPINS_PER_CLOCK_CHECK) {
            return Ok(None);
        }
        let waited = self.start.get_or_insert_with(Instant::now).elapsed();
        if waited >= self.limit {
            return Err(Error::Timeout {
                what: self.what,
                waited,
            });
        }
        if waited >= NAP_AFTER {
            std::thread::sleep(NAP);
        } else if waited >= YIELD_AFTER {
            std::thread::yield_now();
        }
        Ok(Some(waited))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_ends_in_a_typed_timeout_and_reads_the_clock_rarely() {
        let mut w = BoundedWait::new(Duration::ZERO, "nothing");
        for _ in 1..SPINS_PER_CLOCK_CHECK {
            assert!(matches!(w.tick(), Ok(None)));
        }
        match w.tick() {
            Err(Error::Timeout {
                what: "nothing", ..
            }) => {}
            other => panic!("expected a timeout, got {other:?}"),
        }
        let mut w = BoundedWait::new(Duration::from_secs(3600), "later");
        let clock_reads = (0..10 * SPINS_PER_CLOCK_CHECK)
            .filter(|_| w.tick().unwrap().is_some())
            .count();
        assert_eq!(clock_reads, 10);
    }

    #[test]
    fn a_long_wait_still_ends_in_its_timeout() {
        // Past YIELD_AFTER every clock check yields, past NAP_AFTER it
        // sleeps; the deadline holds.
        let mut w = BoundedWait::new(NAP_AFTER * 2, "a long wait");
        let err = loop {
            if let Err(e) = w.tick() {
                break e;
            }
        };
        match err {
            Error::Timeout { what, waited } => {
                assert_eq!(what, "a long wait");
                assert!(waited >= NAP_AFTER * 2, "{waited:?}");
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
    }
}
