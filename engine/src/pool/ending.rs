//! How one connection of a poller ends while the others carry on
//! (`docs/design/many-peers-per-core.md` §1.5), as an I/O-free state
//! machine: the poller tells it what happened and does the one step it
//! answers. Nothing here waits: the poller's turn drives it.
//!
//! The queue pair goes to ERR; a last signaled request (the marker) is
//! posted as soon as the send queue has room (flushes make room), and its
//! completion proves the send queue empty. The receive side would be
//! proven by `QP_LAST_WQE_REACHED` (ConnectX; rxe 6.1 never sends it, and
//! the poller does not read the device's async events yet: S5's
//! mailbox), so today it gets a grace, and the queue pair is destroyed
//! only at a turn that emptied the receive CQ after it (a backlog of
//! completions is not outrun by the clock). A deadline bounds it all:
//! past it the queue pair is destroyed anyway, and what was not proven is
//! reported (a receive slot of the shared queue it held mid-message stays
//! the NIC's for ever: sound, merely lost). Times too far to represent
//! (a `Duration::MAX` setting) mean never, not a panic.

use std::time::{Duration, Instant};

/// What the poller saw of the ending connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Seen {
    /// Its send queue has room for the marker.
    Room,
    /// The marker's completion (any status: a flush proves it too).
    MarkerDone,
    /// `QP_LAST_WQE_REACHED` for its queue pair.
    LastWqe,
    /// Time passed (each turn).
    Tick,
}

/// What the poller is to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Post the marker (a zero-length signaled request) to the ERR queue
    /// pair.
    PostMarker,
    /// Destroy the queue pair, then drop its rings.
    Destroy(Proof),
}

/// What was proven when the queue pair was destroyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proof {
    /// The marker completed: no send request was outstanding.
    pub send: bool,
    /// `QP_LAST_WQE_REACHED` came: it held no shared receive.
    pub receive: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// In ERR, waiting for room to post the marker.
    WantRoom,
    /// The marker is posted.
    Marked,
    /// The send queue is proven empty; waiting for the receive side's
    /// proof until `until` (`None`: never).
    Receives { until: Option<Instant> },
    /// Told to destroy: nothing more.
    Done,
}

/// One ending connection.
#[derive(Debug)]
pub(crate) struct Ending {
    phase: Phase,
    /// `None`: the limit is too far to represent (never).
    deadline: Option<Instant>,
    grace: Duration,
    last_wqe: bool,
    marker_done: bool,
}

impl Ending {
    /// The connection ends now, its queue pair already moved to ERR;
    /// within `limit` it is destroyed whatever happens; without
    /// `QP_LAST_WQE_REACHED` the receive side gets `grace` once the send
    /// side is proven.
    pub(crate) fn new(now: Instant, limit: Duration, grace: Duration) -> Ending {
        Ending {
            phase: Phase::WantRoom,
            deadline: now.checked_add(limit),
            grace,
            last_wqe: false,
            marker_done: false,
        }
    }

    /// Whether it was told to destroy (nothing more comes).
    pub(crate) fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Feeds what the poller saw at `now`; returns the step to take, if any.
    #[cfg(test)]
    pub(crate) fn on(&mut self, seen: Seen, now: Instant) -> Option<Step> {
        self.on_turn(seen, now, true)
    }

    /// [`on`](Self::on) in a turn of the poller's, `drained` if that turn
    /// emptied the receive CQ: a destroy the grace allows waits for such
    /// a turn (the deadline's does not), so that no receive completion of
    /// the queue pair is still unpolled when it goes.
    pub(crate) fn on_turn(&mut self, seen: Seen, now: Instant, drained: bool) -> Option<Step> {
        match (seen, self.phase) {
            (_, Phase::Done) => return None,
            (Seen::Room, Phase::WantRoom) => {
                self.phase = Phase::Marked;
                return Some(Step::PostMarker);
            }
            (Seen::MarkerDone, Phase::Marked) => {
                self.marker_done = true;
                self.phase = Phase::Receives {
                    until: now.checked_add(self.grace),
                };
            }
            (Seen::LastWqe, _) => self.last_wqe = true,
            _ => {}
        }
        let proven = self.marker_done && self.last_wqe;
        let grace_over =
            matches!(self.phase, Phase::Receives { until: Some(until) } if now >= until);
        let past_deadline = self.deadline.is_some_and(|deadline| now >= deadline);
        if past_deadline || ((proven || grace_over) && drained) {
            self.phase = Phase::Done;
            return Some(Step::Destroy(Proof {
                send: self.marker_done,
                receive: self.last_wqe,
            }));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(10);
    const GRACE: Duration = Duration::from_millis(500);

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    /// ConnectX: the marker and LAST_WQE prove both sides; destroyed at
    /// once, whichever comes first.
    #[test]
    fn both_proofs_destroy_at_once_in_either_order() {
        for last_wqe_first in [false, true] {
            let t0 = Instant::now();
            let mut end = Ending::new(t0, LIMIT, GRACE);
            assert_eq!(end.on(Seen::Room, at(t0, 1)), Some(Step::PostMarker));
            let both = Some(Step::Destroy(Proof {
                send: true,
                receive: true,
            }));
            if last_wqe_first {
                assert_eq!(end.on(Seen::LastWqe, at(t0, 2)), None);
                assert_eq!(end.on(Seen::MarkerDone, at(t0, 3)), both);
            } else {
                assert_eq!(end.on(Seen::MarkerDone, at(t0, 2)), None);
                assert_eq!(end.on(Seen::LastWqe, at(t0, 3)), both);
            }
            assert!(end.is_done());
            assert_eq!(
                end.on(Seen::Tick, at(t0, 20_000)),
                None,
                "nothing after the end"
            );
        }
    }

    /// rxe 6.1 sends no LAST_WQE_REACHED: after the marker, the receive
    /// side gets the grace, then the queue pair goes unproven there.
    #[test]
    fn without_last_wqe_the_grace_ends_it_with_the_receive_side_unproven() {
        let t0 = Instant::now();
        let mut end = Ending::new(t0, LIMIT, GRACE);
        assert_eq!(end.on(Seen::Room, t0), Some(Step::PostMarker));
        assert_eq!(end.on(Seen::MarkerDone, at(t0, 100)), None);
        assert_eq!(end.on(Seen::Tick, at(t0, 599)), None, "within the grace");
        assert_eq!(
            end.on(Seen::Tick, at(t0, 600)),
            Some(Step::Destroy(Proof {
                send: true,
                receive: false
            }))
        );
    }

    /// The marker waits for room (a full send queue frees slots as its
    /// requests flush), and is posted once.
    #[test]
    fn the_marker_waits_for_room_and_is_posted_once() {
        let t0 = Instant::now();
        let mut end = Ending::new(t0, LIMIT, GRACE);
        assert_eq!(end.on(Seen::Tick, at(t0, 5)), None);
        assert_eq!(end.on(Seen::MarkerDone, at(t0, 6)), None, "no marker yet");
        assert_eq!(end.on(Seen::Room, at(t0, 7)), Some(Step::PostMarker));
        assert_eq!(end.on(Seen::Room, at(t0, 8)), None, "posted twice");
    }

    /// Settings too far to represent mean never: no panic, and only the
    /// proofs end it.
    #[test]
    fn durations_too_long_to_add_never_panic() {
        let t0 = Instant::now();
        let mut end = Ending::new(t0, Duration::MAX, Duration::MAX);
        assert_eq!(end.on(Seen::Room, t0), Some(Step::PostMarker));
        assert_eq!(end.on(Seen::MarkerDone, at(t0, 1)), None);
        assert_eq!(end.on(Seen::Tick, at(t0, 1_000_000)), None);
        assert_eq!(
            end.on(Seen::LastWqe, at(t0, 1_000_001)),
            Some(Step::Destroy(Proof {
                send: true,
                receive: true
            }))
        );
    }

    /// Past the grace, the destroy waits for a turn that emptied the
    /// receive CQ; past the deadline it does not.
    #[test]
    fn the_grace_s_destroy_waits_for_a_drained_receive_cq() {
        let t0 = Instant::now();
        let mut end = Ending::new(t0, LIMIT, GRACE);
        assert_eq!(end.on(Seen::Room, t0), Some(Step::PostMarker));
        assert_eq!(end.on_turn(Seen::MarkerDone, at(t0, 1), false), None);
        assert_eq!(
            end.on_turn(Seen::Tick, at(t0, 600), false),
            None,
            "a backlog"
        );
        let destroy = Some(Step::Destroy(Proof {
            send: true,
            receive: false,
        }));
        assert_eq!(end.on_turn(Seen::Tick, at(t0, 601), true), destroy);
        let mut flooded = Ending::new(t0, LIMIT, GRACE);
        flooded.on(Seen::Room, t0);
        flooded.on_turn(Seen::MarkerDone, at(t0, 1), false);
        assert_eq!(
            flooded.on_turn(Seen::Tick, at(t0, 10_000), false),
            destroy,
            "the deadline does not wait"
        );
    }

    /// A device that never completes the marker, or never gives room,
    /// holds the connection only until the deadline.
    #[test]
    fn the_deadline_destroys_whatever_was_not_proven() {
        let t0 = Instant::now();
        let mut never_room = Ending::new(t0, LIMIT, GRACE);
        assert_eq!(never_room.on(Seen::Tick, at(t0, 9_999)), None);
        assert_eq!(
            never_room.on(Seen::Tick, at(t0, 10_000)),
            Some(Step::Destroy(Proof {
                send: false,
                receive: false
            }))
        );
        let mut never_done = Ending::new(t0, LIMIT, GRACE);
        never_done.on(Seen::Room, t0);
        never_done.on(Seen::LastWqe, at(t0, 1));
        assert_eq!(
            never_done.on(Seen::Tick, at(t0, 10_000)),
            Some(Step::Destroy(Proof {
                send: false,
                receive: true
            }))
        );
    }
}
