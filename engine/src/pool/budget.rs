//! The completion queues a poller's connections share must never
//! overflow: a full CQ raises `CQ_ERR` and ends every connection on it,
//! not just the one that filled it. In ERR every outstanding request
//! flushes with a completion of its own, signaled or not, so the send CQ
//! must hold every send-queue slot of every connection (live or ending)
//! at once, and the receive CQ every receive of the shared queue. A
//! connection joins only while its send queue still fits.

/// Why a connection may not join.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overbooked {
    /// The send-queue slots it asked for.
    pub asked: u32,
    /// What the send CQ has left.
    pub left: u32,
}

/// The send CQ's entries, and how many the joined connections' send
/// queues may fill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CqBudget {
    depth: u32,
    booked: u32,
}

impl CqBudget {
    /// A send CQ of `depth` entries, nothing booked.
    pub(crate) fn new(depth: u32) -> CqBudget {
        CqBudget { depth, booked: 0 }
    }

    /// Books `send_depth` entries for a connection that joins; refused,
    /// booking nothing, when they do not fit.
    pub(crate) fn book(&mut self, send_depth: u32) -> Result<(), Overbooked> {
        let left = self.depth - self.booked;
        if send_depth > left {
            return Err(Overbooked {
                asked: send_depth,
                left,
            });
        }
        self.booked += send_depth;
        Ok(())
    }

    /// Gives back a connection's entries once its queue pair is destroyed
    /// (not when it ends: until then its requests may still flush).
    pub(crate) fn release(&mut self, send_depth: u32) {
        debug_assert!(send_depth <= self.booked, "released more than booked");
        self.booked -= send_depth.min(self.booked);
    }

    pub(crate) fn booked(&self) -> u32 {
        self.booked
    }
}

/// Whether a shared receive queue of `srq_depth` receives fits a receive
/// CQ of `cq_depth` entries (every receive may complete before a poll).
pub(crate) fn receives_fit(srq_depth: u32, cq_depth: u32) -> bool {
    srq_depth <= cq_depth
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_join_while_their_send_queues_fit_and_leave_when_destroyed() {
        let mut budget = CqBudget::new(40);
        budget.book(16).unwrap();
        budget.book(16).unwrap();
        assert_eq!(budget.book(16), Err(Overbooked { asked: 16, left: 8 }));
        assert_eq!(budget.booked(), 32, "a refusal books nothing");
        budget.book(8).unwrap();
        assert_eq!(budget.book(1), Err(Overbooked { asked: 1, left: 0 }));
        budget.release(16);
        budget.book(16).unwrap();
        assert_eq!(budget.booked(), 40);
    }

    /// rxe's `max_cqe` (32 767) with the default send depth of 16: 2047
    /// connections per poller, not one more.
    #[test]
    fn rxe_s_largest_cq_holds_2047_connections_of_depth_16() {
        let mut budget = CqBudget::new(32_767);
        let joined = (0..).take_while(|_| budget.book(16).is_ok()).count();
        assert_eq!(joined, 2047);
        assert!(receives_fit(32_767, 32_767));
        assert!(!receives_fit(32_768, 32_767));
    }
}
