//! A connection's receive queue: a ring of receive slots, one posted
//! receive per slot, re-posted in batches — the only code that moves a
//! receive slot between the NIC and the CPU.
//!
//! A slot is the NIC's from the post of its receive until that receive's
//! completion; then it is the CPU's until the receive for the same slot
//! one lap later is posted. Views of a slot are made only in between, and
//! posting needs `&mut self`, so no view outlives its slot's turn.

use super::cq::{CqPoller, WorkCompletion};
use super::layout::SlotLayout;
use super::ledger::RecvLedger;
use super::mr::{LocalSlice, Registration};
use super::qp::QueuePair;
use super::send_queue::POLL_BATCH;
use super::wr::RecvChain;
use crate::error::Result;
use crate::status::{WcOpcode, WcStatus};

/// A receive completion, copied out of the CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arrival {
    /// The receive's position (its wr_id).
    pub pos: u64,
    pub status: WcStatus,
    pub vendor_err: u32,
    /// Bytes received (WRITE_WITH_IMM: bytes written to the target).
    pub len: u32,
    pub imm: Option<u32>,
    /// A WRITE_WITH_IMM, whose bytes went to the target ring, not here.
    pub write_imm: bool,
}

/// The receive queue of one connection.
pub(crate) struct RecvQueue {
    chain: RecvChain,
    ledger: RecvLedger,
    ring: Registration,
    layout: SlotLayout,
    poller: CqPoller,
    wcs: [WorkCompletion; POLL_BATCH],
}

impl std::fmt::Debug for RecvQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvQueue")
            .field("ledger", &self.ledger)
            .field("layout", &self.layout)
            .finish()
    }
}

impl RecvQueue {
    /// One receive per slot of `layout` in `ring`, posted in batches of up
    /// to `batch`.
    pub(crate) fn new(
        poller: CqPoller,
        ring: Registration,
        layout: SlotLayout,
        batch: usize,
    ) -> RecvQueue {
        assert!(ring.len() >= layout.bytes());
        RecvQueue {
            chain: RecvChain::new(batch.min(layout.count())),
            ledger: RecvLedger::new(layout.count()),
            ring,
            layout,
            poller,
            wcs: WorkCompletion::array(),
        }
    }

    /// Receives posted and not yet completed.
    #[inline]
    pub(crate) fn outstanding(&self) -> u64 {
        self.ledger.outstanding()
    }

    /// Whether some completed receives wait to be posted again.
    #[inline]
    pub(crate) fn needs_refill(&self) -> bool {
        !self.ledger.is_full()
    }

    /// Posts receives until every slot has one, in batches. When the
    /// provider refuses part way, what it took counts as posted and the
    /// rest is posted again by the next call.
    pub(crate) fn refill(&mut self, qp: &mut QueuePair) -> Result<()> {
        loop {
            let wanted = self.ledger.wanted();
            let n = (wanted.end - wanted.start).min(self.chain.capacity() as u64) as usize;
            if n == 0 {
                return Ok(());
            }
            for (i, pos) in (wanted.start..wanted.start + n as u64).enumerate() {
                let range = self.layout.range(pos, self.layout.size());
                let slot = LocalSlice {
                    addr: self.ring.addr() + range.start as u64,
                    len: range.len() as u32,
                    lkey: self.ring.lkey(),
                };
                self.chain.patch(i, pos, Some(slot));
            }
            // SAFETY: each position's slot is the CPU's (its previous
            // receive completed, per the ledger) and becomes the NIC's now;
            // no view of it exists, as views borrow self and this takes
            // &mut self.
            match unsafe { self.chain.post(qp, n) } {
                Ok(()) => self.ledger.posted(n as u64),
                Err(refused) => {
                    self.ledger.posted(refused.posted as u64);
                    return Err(refused.error);
                }
            }
        }
    }

    /// Polls for up to `max` receive completions (at most [`POLL_BATCH`])
    /// and hands each to `on` with its bytes (empty for WRITE_WITH_IMM and
    /// failed receives). Returns how many were taken.
    #[inline]
    pub(crate) fn poll(&mut self, max: usize, mut on: impl FnMut(Arrival, &[u8])) -> Result<usize> {
        let max = max.min(POLL_BATCH);
        let n = self.poller.poll(&mut self.wcs[..max])?;
        for i in 0..n {
            let pos = self.ledger.complete(self.wcs[i].wr_id())?;
            let arrival = describe(&self.wcs[i], pos);
            on(arrival, self.bytes(&arrival));
        }
        Ok(n)
    }

    /// The bytes a successful SEND delivered into `arrival`'s slot, while
    /// that slot is still the CPU's (empty otherwise).
    #[inline]
    pub(crate) fn data(&self, arrival: &Arrival) -> &[u8] {
        if !self.ledger.is_readable(arrival.pos) {
            return &[];
        }
        self.bytes(arrival)
    }

    #[inline(always)]
    fn bytes(&self, arrival: &Arrival) -> &[u8] {
        if arrival.write_imm || arrival.status != WcStatus::SUCCESS {
            return &[];
        }
        let len = (arrival.len as usize).min(self.layout.size());
        let range = self.layout.range(arrival.pos, len);
        // SAFETY: the receive at `pos` completed (the ledger checked its
        // completion, or `data` checked is_readable), so the NIC is done
        // writing the slot, and its next receive is posted only by
        // `refill`, which needs &mut self while this borrows self. The
        // range is inside the ring (`new` checked its size).
        unsafe { std::slice::from_raw_parts(self.ring.at(range.start), range.len()) }
    }
}

#[inline(always)]
fn describe(wc: &WorkCompletion, pos: u64) -> Arrival {
    let status = wc.status();
    let success = status == WcStatus::SUCCESS;
    Arrival {
        pos,
        status,
        vendor_err: wc.vendor_err(),
        len: wc.byte_len(),
        imm: if success { wc.imm() } else { None },
        write_imm: success && wc.opcode() == WcOpcode::RECV_RDMA_WITH_IMM,
    }
}
