//! The poller's walks over the completions one poll took. Each is
//! dropped normally only by `mem::forget` once the walk is done; dropped
//! by a panic in the caller's callback, it settles the rest of the
//! completions silently (no connection's ledger lags the NIC, no slot of
//! the shared queue is lost) and marks the poller unwound: their events
//! were never handed on.

use super::ends::EndingConn;
use super::poller::{PoolStats, Where};
use super::pooled::Pooled;
use super::qpn_table::QpnTable;
use super::slab::{ConnId, Slab};
use crate::sys::cq::{Polled, WorkCompletion};
use crate::sys::srq_ring::{SrqRing, SrqSlot};

/// Which connection a completion is about, by its queue pair number.
pub(super) enum Found<'a> {
    Live(ConnId, &'a mut Pooled),
    Ending(&'a mut Pooled),
}

/// The connection, live or ending, whose queue pair `qpn` is.
pub(super) fn find<'a>(
    qpns: &QpnTable<Where>,
    slab: &'a mut Slab<Pooled>,
    endings: &'a mut [EndingConn],
    qpn: u32,
) -> Option<Found<'a>> {
    match qpns.get(qpn)? {
        Where::Live(index) => slab.at_mut(index).map(|(id, conn)| Found::Live(id, conn)),
        Where::Ending(at) => endings
            .get_mut(at as usize)
            .map(|ending| Found::Ending(&mut ending.conn)),
    }
}

/// Where `poll_sends` is in the completions it took.
pub(super) struct SendPoolWalk<'a, I: Iterator<Item = Polled<'a>>> {
    pub(super) slab: &'a mut Slab<Pooled>,
    pub(super) endings: &'a mut [EndingConn],
    pub(super) qpns: &'a QpnTable<Where>,
    pub(super) stats: &'a mut PoolStats,
    pub(super) to_end: &'a mut Vec<ConnId>,
    pub(super) unwound: &'a mut bool,
    pub(super) rest: I,
}

impl<'a, I: Iterator<Item = Polled<'a>>> SendPoolWalk<'a, I> {
    /// The connection `wc` is about, or `None` (counted stale).
    pub(super) fn find(&mut self, wc: &WorkCompletion) -> Option<Found<'_>> {
        let found = find(self.qpns, self.slab, self.endings, wc.qp_num());
        if found.is_none() {
            self.stats.stale += 1;
        }
        found
    }

    /// Retires what the rest of the completions name, handing nothing on.
    #[cold]
    fn settle_rest(&mut self) {
        while let Some(polled) = self.rest.next() {
            match self.find(polled.wc()) {
                Some(Found::Live(_, conn) | Found::Ending(conn)) => {
                    let _ = conn.sq.retire(polled.alone(), |_| {});
                }
                None => {}
            }
        }
    }
}

impl<'a, I: Iterator<Item = Polled<'a>>> Drop for SendPoolWalk<'a, I> {
    #[cold]
    fn drop(&mut self) {
        self.settle_rest();
        *self.unwound = true;
    }
}

/// Where `poll_receives` is in the completions it took, and the slot lent
/// while the callback runs.
pub(super) struct RecvPoolWalk<'a, I: Iterator<Item = Polled<'a>>> {
    pub(super) ring: &'a mut SrqRing,
    pub(super) unwound: &'a mut bool,
    pub(super) rest: I,
    pub(super) lent: Option<SrqSlot>,
}

impl<'a, I: Iterator<Item = Polled<'a>>> Drop for RecvPoolWalk<'a, I> {
    #[cold]
    fn drop(&mut self) {
        if let Some(slot) = self.lent.take() {
            let _ = self.ring.release(slot);
        }
        for polled in self.rest.by_ref() {
            if let Ok(slot) = self.ring.settle(polled) {
                let _ = self.ring.release(slot);
            }
        }
        *self.unwound = true;
    }
}
