//! Send-queue accounting under selective signaling.
//!
//! Every send-queue work request gets a sequence number (its wr_id). Only
//! some are signaled; a signaled completion for sequence `s` retires every
//! request up to and including `s` (RC completes in order). The queue can
//! never overflow: a request is admitted only while `posted - retired`
//! leaves room, and because `batch_size + signal_interval <= depth`, a
//! full queue always holds a signaled request whose completion frees it.

/// Sequence numbers of posted and retired send-queue work requests.
#[derive(Debug, Clone)]
pub struct SendQueueAccount {
    depth: u64,
    interval: u64,
    posted: u64,
    retired: u64,
    /// The newest signaled request admitted, if any.
    last_signaled: Option<u64>,
}

impl SendQueueAccount {
    pub fn new(depth: u32, signal_interval: u32) -> SendQueueAccount {
        assert!(depth > 0 && signal_interval > 0 && signal_interval <= depth);
        SendQueueAccount {
            depth: depth.into(),
            interval: signal_interval.into(),
            posted: 0,
            retired: 0,
            last_signaled: None,
        }
    }

    /// Work requests posted and not yet retired.
    #[inline]
    pub fn outstanding(&self) -> u64 {
        self.posted - self.retired
    }

    /// Free send-queue slots.
    #[inline]
    pub fn room(&self) -> u64 {
        self.depth - self.outstanding()
    }

    #[inline]
    pub fn posted(&self) -> u64 {
        self.posted
    }

    #[inline]
    pub fn retired(&self) -> u64 {
        self.retired
    }

    /// Admits one more request: its sequence number and whether it must be
    /// signaled (every K-th, or when the caller needs its completion).
    /// `None` when the queue is full: poll completions, then retry.
    #[inline]
    pub fn admit(&mut self, must_signal: bool) -> Option<(u64, bool)> {
        if self.outstanding() >= self.depth {
            return None;
        }
        let seq = self.posted;
        self.posted += 1;
        let signaled = must_signal || (seq + 1).is_multiple_of(self.interval);
        if signaled {
            self.last_signaled = Some(seq);
        }
        Some((seq, signaled))
    }

    /// Forgets admitted requests back to `posted` (a batch dropped before
    /// it was posted).
    #[inline]
    pub fn rollback(&mut self, posted: u64) {
        debug_assert!(posted >= self.retired && posted <= self.posted);
        self.posted = posted;
        if self.last_signaled.is_some_and(|s| s >= posted) {
            // Conservative: forget it; at worst a drain posts one more signal.
            self.last_signaled = None;
        }
    }

    /// Whether a signaled request is outstanding, i.e. a completion is
    /// still coming that will retire the unsignaled ones before it.
    #[inline]
    pub fn signal_in_flight(&self) -> bool {
        self.last_signaled.is_some_and(|s| s >= self.retired)
    }

    /// A completion for `seq` arrived: retires every request through it.
    /// Returns the range of sequence numbers newly retired (empty when
    /// `seq` was already retired, which a correct CQ never reports).
    #[inline]
    pub fn retire_through(&mut self, seq: u64) -> std::ops::Range<u64> {
        let from = self.retired;
        let to = (seq + 1).min(self.posted).max(from);
        self.retired = to;
        from..to
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kth_request_is_signaled_and_forced_ones_too() {
        let mut sq = SendQueueAccount::new(64, 4);
        let signals: Vec<bool> = (0..8).map(|_| sq.admit(false).unwrap().1).collect();
        assert_eq!(
            signals,
            [false, false, false, true, false, false, false, true]
        );
        assert_eq!(sq.admit(true), Some((8, true)));
    }

    #[test]
    fn the_queue_never_overflows_and_a_completion_retires_everything_before_it() {
        let mut sq = SendQueueAccount::new(8, 4);
        for _ in 0..8 {
            sq.admit(false).unwrap();
        }
        assert_eq!(sq.admit(false), None, "full");
        assert_eq!(sq.room(), 0);
        // The completion of seq 3 (the first signaled one) retires 0..=3.
        assert_eq!(sq.retire_through(3), 0..4);
        assert_eq!(sq.room(), 4);
        assert_eq!(sq.retire_through(3), 4..4, "nothing twice");
        assert_eq!(sq.retire_through(7), 4..8);
        assert_eq!(sq.outstanding(), 0);
    }

    #[test]
    fn a_full_queue_always_holds_a_signaled_request() {
        // With batch + K <= depth, whenever a batch of `batch` does not fit,
        // the outstanding requests include a signaled one.
        let (depth, k, batch) = (16u32, 4u32, 12u32);
        let mut sq = SendQueueAccount::new(depth, k);
        let mut last_signaled = None;
        for round in 0..1000u64 {
            let n = 1 + (round % u64::from(batch));
            if sq.room() < n {
                let oldest_unretired = sq.retired();
                let signaled = last_signaled.filter(|s| *s >= oldest_unretired);
                assert!(
                    signaled.is_some(),
                    "round {round}: a full queue with no signaled request would deadlock"
                );
                sq.retire_through(signaled.unwrap());
                continue;
            }
            for _ in 0..n {
                let (seq, sig) = sq.admit(false).unwrap();
                if sig {
                    last_signaled = Some(seq);
                }
            }
        }
    }

    #[test]
    fn knows_whether_a_completion_is_still_coming() {
        let mut sq = SendQueueAccount::new(8, 4);
        sq.admit(false).unwrap();
        assert!(
            !sq.signal_in_flight(),
            "an unsignaled tail needs a signal to drain"
        );
        sq.admit(true).unwrap();
        assert!(sq.signal_in_flight());
        sq.retire_through(1);
        assert!(!sq.signal_in_flight());
    }

    #[test]
    fn rollback_forgets_an_unposted_batch() {
        let mut sq = SendQueueAccount::new(8, 2);
        sq.admit(false).unwrap();
        let mark = sq.posted();
        sq.admit(false).unwrap();
        sq.admit(false).unwrap();
        sq.rollback(mark);
        assert_eq!(sq.admit(false), Some((1, true)));
    }
}
