//! When a poller that may sleep goes to sleep (`PollerIdle::Block` of
//! `docs/design/many-peers-per-core.md` §1.7), as an I/O-free state
//! machine. An armed CQ raises an event only for a completion added after
//! the arming (probed on rxe: `an_armed_cq_wakes_its_channel_once_and_only_for_new_completions`),
//! so the rule is: after enough empty turns, arm, poll once more, and
//! sleep only if that poll found nothing too — else a completion that came
//! between the last poll and the arming would wait for the next one.

/// What the poller is to do after a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Poll again now.
    Spin,
    /// Arm the CQs, then poll again now (the poll that decides).
    ArmThenPoll,
    /// Sleep on the channel's descriptor (and the others of the poller)
    /// until something is readable; then poll.
    Sleep,
}

/// Counts empty turns of one poller.
#[derive(Debug)]
pub(crate) struct Idle {
    /// Empty turns spun before arming.
    spins: u32,
    empty: u32,
    armed: bool,
}

impl Idle {
    pub(crate) fn new(spins: u32) -> Idle {
        Idle {
            spins,
            empty: 0,
            armed: false,
        }
    }

    /// A turn found `work` completions or events; what comes next.
    pub(crate) fn after_turn(&mut self, work: usize) -> Next {
        if work > 0 {
            // Work came: spin again. An arming still pending raises one
            // event later, which costs a wake-up, not a miss.
            self.empty = 0;
            self.armed = false;
            return Next::Spin;
        }
        if self.armed {
            // The poll after the arming found nothing: whatever comes now
            // raises an event.
            self.armed = false;
            self.empty = 0;
            return Next::Sleep;
        }
        self.empty = self.empty.saturating_add(1);
        if self.empty > self.spins {
            self.armed = true;
            return Next::ArmThenPoll;
        }
        Next::Spin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_spins_then_arms_then_polls_once_more_before_sleeping() {
        let mut idle = Idle::new(3);
        let turns: Vec<Next> = (0..5).map(|_| idle.after_turn(0)).collect();
        assert_eq!(
            turns,
            [
                Next::Spin,
                Next::Spin,
                Next::Spin,
                Next::ArmThenPoll,
                Next::Sleep
            ]
        );
        // Woken: the turn after the sleep starts counting afresh.
        assert_eq!(idle.after_turn(0), Next::Spin);
    }

    /// A completion found by the poll after the arming means no sleep:
    /// the poller spins on, and counts its empty turns from zero.
    #[test]
    fn work_found_after_arming_keeps_it_awake() {
        let mut idle = Idle::new(1);
        assert_eq!(idle.after_turn(0), Next::Spin);
        assert_eq!(idle.after_turn(0), Next::ArmThenPoll);
        assert_eq!(
            idle.after_turn(2),
            Next::Spin,
            "the decisive poll found work"
        );
        assert_eq!(idle.after_turn(0), Next::Spin);
        assert_eq!(idle.after_turn(0), Next::ArmThenPoll);
    }

    /// With no spinning, every empty turn arms and the next one sleeps.
    #[test]
    fn zero_spins_arms_at_the_first_empty_turn() {
        let mut idle = Idle::new(0);
        assert_eq!(idle.after_turn(0), Next::ArmThenPoll);
        assert_eq!(idle.after_turn(0), Next::Sleep);
    }
}
