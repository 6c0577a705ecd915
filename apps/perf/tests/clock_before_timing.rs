//! Host test (no device), alone in its binary so that nothing else in the
//! process has read the clock's scale: the ~20 ms calibration of the tick
//! clock happens before `measure` starts timing, never inside a timed
//! round trip or stream (where a wait's first clock check used to trigger
//! it).

use pinpoll::datapath::Stats;
use pinpoll_perf::driver::Driver;
use pinpoll_perf::{clock, session, Kind};

/// A driver that does no I/O and notes, at each operation, whether the
/// clock was calibrated by then.
#[derive(Default)]
struct Probe {
    calibrated_at_each_call: Vec<bool>,
}

impl Driver for Probe {
    fn round_trip(&mut self) -> anyhow::Result<()> {
        self.calibrated_at_each_call.push(clock::is_calibrated());
        Ok(())
    }

    fn stream(&mut self, _n: u64) -> anyhow::Result<()> {
        self.calibrated_at_each_call.push(clock::is_calibrated());
        Ok(())
    }

    fn stats(&self) -> Option<Stats> {
        Some(Stats::default())
    }

    fn inline_threshold(&self) -> usize {
        0
    }

    fn quiesce(&mut self) -> anyhow::Result<()> {
        Ok(())
    }

    fn finish(self: Box<Self>) -> anyhow::Result<Stats> {
        Ok(Stats::default())
    }
}

#[test]
fn the_clock_is_calibrated_before_the_first_timed_operation() {
    assert!(
        !clock::is_calibrated(),
        "nothing in this test binary may calibrate before measure"
    );
    let mut probe = Probe::default();
    // No warm-up: the first call is timed.
    session::measure(&mut probe, Kind::ReadLat, 8, 5, 0).unwrap();
    assert_eq!(probe.calibrated_at_each_call, vec![true; 5]);

    let mut probe = Probe::default();
    session::measure(&mut probe, Kind::WriteBw, 64, 100, 0).unwrap();
    assert_eq!(probe.calibrated_at_each_call, vec![true]);
}
