//! Work requests: the one builder that fills a verbs `ibv_send_wr`, and the
//! pre-built chains the data path patches and posts with one doorbell.
//!
//! A chain's requests and scatter/gather entries are linked once at setup;
//! posting patches only what changes per operation (id, opcode, flags,
//! buffer, remote address) and terminates the list after the last entry
//! for the one `ibv_post_send`. When the provider refuses a request part
//! way, `bad_wr` says which: everything before it was posted, it and
//! everything after were not ([`PostFailed::posted`]). When the call fails
//! and `bad_wr` names none of the list, nothing is known: rdma-core's rxe
//! sets `*bad_wr = NULL`, queues every request, and then returns its
//! doorbell's error — the requests still run at the next doorbell. So
//! every request is then taken as posted, and the caller
//! must make sure each completes before its memory is used again
//! ([`PostFailed::Unknown`]).

use std::mem::MaybeUninit;

use super::ffi;
use super::mr::{LocalSlice, RemoteSlice};
use super::qp::QueuePair;
use super::srq::SrqPoster;
use crate::error::{errno, Error};

/// The send-queue operations the engine posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendOpcode {
    Send,
    Write,
    /// WRITE_WITH_IMM: the immediate, in host order.
    WriteWithImm(u32),
    Read,
}

impl SendOpcode {
    #[inline]
    fn raw(self) -> u32 {
        match self {
            SendOpcode::Send => ffi::ibv_wr_opcode::IBV_WR_SEND,
            SendOpcode::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            SendOpcode::WriteWithImm(_) => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            SendOpcode::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
        }
    }
}

/// Where a send-queue request's payload is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payload<'d> {
    /// Registered memory the NIC reads (or, for a READ, writes) by DMA.
    Registered(LocalSlice),
    /// Bytes the provider copies into the work queue entry at post time.
    Inline(&'d [u8]),
}

/// One send-queue request, as the builder takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendRequest<'d> {
    pub wr_id: u64,
    pub opcode: SendOpcode,
    pub payload: Payload<'d>,
    /// The peer's memory for RDMA opcodes; ignored for SEND.
    pub remote: RemoteSlice,
    pub signaled: bool,
}

/// What a failed post did to its list of requests.
#[derive(Debug)]
pub(crate) enum PostFailed {
    /// The provider took the first `posted` requests and refused the rest.
    Refused { posted: usize, error: Error },
    /// It did not say which one it refused: every request of the list must
    /// be taken as posted.
    Unknown(Indeterminate),
}

/// A post that failed without naming the request it refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Indeterminate {
    pub call: &'static str,
    /// Requests in the call, all taken as posted.
    pub requests: usize,
    pub errno: i32,
}

impl Indeterminate {
    #[cold]
    #[inline(never)]
    pub(crate) fn error(self) -> Error {
        Error::PostIndeterminate {
            call: self.call,
            requests: self.requests,
            source: errno(self.errno),
        }
    }
}

/// Fills `wr` and its `sge` for `req`: the one place a send work request
/// is built. Links (`next`, `sg_list`) stay as they are.
#[inline(always)]
fn fill_send(wr: &mut ffi::ibv_send_wr, sge: &mut ffi::ibv_sge, req: &SendRequest<'_>) {
    let (addr, length, lkey, inline) = match req.payload {
        Payload::Registered(s) => (s.addr, s.len, s.lkey, 0),
        Payload::Inline(data) => (
            data.as_ptr() as u64,
            data.len() as u32,
            0,
            ffi::ibv_send_flags::IBV_SEND_INLINE.0,
        ),
    };
    *sge = ffi::ibv_sge { addr, length, lkey };
    wr.wr_id = req.wr_id;
    wr.opcode = req.opcode.raw();
    wr.send_flags = inline
        | if req.signaled {
            ffi::ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
    wr.wr.rdma.remote_addr = req.remote.addr;
    wr.wr.rdma.rkey = req.remote.rkey;
    if let SendOpcode::WriteWithImm(imm) = req.opcode {
        wr.__bindgen_anon_1.imm_data = imm.to_be();
    }
}

/// Posts the NULL-terminated list at `first`; on refusal, how many of the
/// list went before the refused one, found by its position in `list`.
///
/// # Safety
/// `first` is `list.as_mut_ptr()` and `list` a NULL-terminated linked run
/// of initialised requests whose scatter/gather entries are valid for the
/// call; the memory they name must be the NIC's to access as their
/// opcodes say until each completes (or the QP is destroyed).
#[inline(always)]
unsafe fn post_send_list(
    qp: &mut QueuePair,
    list: &mut [ffi::ibv_send_wr],
) -> Result<(), PostFailed> {
    let mut bad = std::ptr::null_mut();
    // SAFETY: the caller's contract; the provider copies the requests
    // (and inline data) into its queue before it returns.
    let rc = unsafe { ffi::ibv_post_send(qp.as_ptr(), list.as_mut_ptr(), &mut bad) };
    #[cfg(test)]
    let (rc, bad) = fault::after_post(rc, bad);
    if rc == 0 {
        return Ok(());
    }
    Err(refused(Queue::Send, list, bad, rc))
}

/// The queues a post goes to.
#[derive(Debug, Clone, Copy)]
enum Queue {
    Send,
    Recv,
    SharedRecv,
}

/// A work request of either queue, as a failed post names it.
trait WorkRequest {
    fn id(&self) -> u64;
}

impl WorkRequest for ffi::ibv_send_wr {
    fn id(&self) -> u64 {
        self.wr_id
    }
}

impl WorkRequest for ffi::ibv_recv_wr {
    fn id(&self) -> u64 {
        self.wr_id
    }
}

impl WorkRequest for u64 {
    fn id(&self) -> u64 {
        *self
    }
}

/// What a failed post of `list` to `queue` did, as `bad` tells it.
#[cold]
#[inline(never)]
fn refused<T: WorkRequest>(queue: Queue, list: &[T], bad: *const T, rc: i32) -> PostFailed {
    let Some(posted) = position(list, bad) else {
        return PostFailed::Unknown(Indeterminate {
            call: match queue {
                Queue::Send => "ibv_post_send",
                Queue::Recv => "ibv_post_recv",
                Queue::SharedRecv => "ibv_post_srq_recv",
            },
            requests: list.len(),
            errno: rc,
        });
    };
    let wr_id = list.get(posted).map_or(0, T::id);
    let source = errno(rc);
    PostFailed::Refused {
        posted,
        error: match queue {
            Queue::Send => Error::PostSend {
                wr_id,
                posted,
                source,
            },
            Queue::Recv | Queue::SharedRecv => Error::PostRecv {
                wr_id,
                posted,
                source,
            },
        },
    }
}

/// The index of `bad` in `list`, compared as addresses (never
/// dereferenced); `None` for a pointer outside the list (rxe's NULL after
/// a failed doorbell): the provider did not say which it refused.
fn position<T>(list: &[T], bad: *const T) -> Option<usize> {
    let base = list.as_ptr() as usize;
    let size = std::mem::size_of::<T>();
    let at = (bad as usize).wrapping_sub(base);
    let index = at.checked_div(size)?;
    (at.is_multiple_of(size) && index < list.len()).then_some(index)
}

/// A provider that fails a post after queueing every request, as rxe does
/// when its doorbell fails: the unit tests' way to reach that path on a
/// device whose doorbell never fails.
#[cfg(test)]
pub(crate) mod fault {
    use std::cell::Cell;

    thread_local! {
        static NEXT: Cell<Option<i32>> = const { Cell::new(None) };
    }

    /// The next post of this thread runs for real, then reports `errno`
    /// with `bad_wr` NULL.
    pub(crate) fn fail_next_post_after_queueing(errno: i32) {
        NEXT.with(|n| n.set(Some(errno)));
    }

    pub(super) fn after_post<T>(rc: i32, bad: *mut T) -> (i32, *mut T) {
        match NEXT.with(Cell::take) {
            Some(errno) if rc == 0 => (errno, std::ptr::null_mut()),
            _ => (rc, bad),
        }
    }
}

/// A fixed chain of send work requests, linked once.
pub(crate) struct SendChain {
    // Boxed so the addresses the links point at never move.
    wrs: Box<[ffi::ibv_send_wr]>,
    sges: Box<[ffi::ibv_sge]>,
}

// SAFETY: the chain's raw pointers point only into its own boxed arrays
// (and, during a post, at inline data the caller borrows for that call);
// moving the owner to another thread moves all of them together.
unsafe impl Send for SendChain {}

impl std::fmt::Debug for SendChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendChain")
            .field("capacity", &self.wrs.len())
            .finish()
    }
}

impl SendChain {
    /// Allocates and links `capacity` work requests (setup time only).
    pub(crate) fn new(capacity: usize) -> SendChain {
        assert!(capacity > 0, "a chain holds at least one work request");
        // SAFETY: ibv_send_wr is plain data (integers, pointers, unions of
        // them); all-zero is a valid value.
        let zero = || unsafe { MaybeUninit::<ffi::ibv_send_wr>::zeroed().assume_init() };
        let mut wrs: Box<[ffi::ibv_send_wr]> = (0..capacity).map(|_| zero()).collect();
        let mut sges: Box<[ffi::ibv_sge]> = vec![ffi::ibv_sge::default(); capacity].into();
        let base = wrs.as_mut_ptr();
        for (i, (wr, sge)) in wrs.iter_mut().zip(sges.iter_mut()).enumerate() {
            wr.sg_list = sge;
            wr.num_sge = 1;
            wr.next = base.wrapping_add(i.wrapping_add(1));
        }
        if let Some(last) = wrs.last_mut() {
            last.next = std::ptr::null_mut();
        }
        SendChain { wrs, sges }
    }

    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.wrs.len()
    }

    /// Writes `req` into entry `i`.
    #[inline(always)]
    pub(crate) fn patch(&mut self, i: usize, req: &SendRequest<'_>) {
        fill_send(&mut self.wrs[i], &mut self.sges[i], req);
    }

    /// Posts entries `0..n` (patched, `1 <= n <= capacity`) with one
    /// `ibv_post_send`, terminating the list after entry `n - 1` for the
    /// call and restoring the link afterwards.
    ///
    /// # Safety
    /// Every patched entry's payload is memory the NIC may access as its
    /// opcode says until the request completes: registered memory whose
    /// ownership the caller has handed to the NIC, or inline bytes that
    /// live for this call.
    #[inline(always)]
    pub(crate) unsafe fn post(&mut self, qp: &mut QueuePair, n: usize) -> Result<(), PostFailed> {
        // n >= 1 (callers post something); 0 would wrap, and the index
        // below would panic before anything is posted.
        let last = n.wrapping_sub(1);
        let saved = self.wrs[last].next;
        self.wrs[last].next = std::ptr::null_mut();
        // SAFETY: entries 0..n are initialised and linked, ending in NULL
        // now; their SGEs point into `sges`; the payloads are the caller's
        // contract.
        let result = unsafe { post_send_list(qp, &mut self.wrs[..n]) };
        self.wrs[last].next = saved;
        result
    }
}

/// Posts one send-queue request built on the stack (the low-level,
/// one-at-a-time path: setup messages, the classic protocol).
///
/// # Safety
/// As for [`SendChain::post`], for `req`'s payload — also when this
/// fails with [`PostFailed::Unknown`].
pub(crate) unsafe fn post_one(qp: &mut QueuePair, req: &SendRequest<'_>) -> Result<(), PostFailed> {
    // SAFETY: plain data, all-zero is valid.
    let mut wr = unsafe { MaybeUninit::<ffi::ibv_send_wr>::zeroed().assume_init() };
    let mut sge = ffi::ibv_sge::default();
    fill_send(&mut wr, &mut sge, req);
    wr.sg_list = &mut sge;
    wr.num_sge = 1;
    // SAFETY: one request, NULL-terminated, its SGE on our stack for the
    // call; the payload is the caller's contract.
    unsafe { post_send_list(qp, std::slice::from_mut(&mut wr)) }
}

/// Posts one receive built on the stack, into `buffer` or (with `None`)
/// without a buffer.
///
/// # Safety
/// `buffer` names registered memory the NIC may write until the receive
/// completes (or the QP is destroyed), and nothing reads it meanwhile —
/// also when this fails with [`PostFailed::Unknown`].
pub(crate) unsafe fn post_one_recv(
    qp: &mut QueuePair,
    wr_id: u64,
    buffer: Option<LocalSlice>,
) -> Result<(), PostFailed> {
    let mut sge = match buffer {
        Some(s) => ffi::ibv_sge {
            addr: s.addr,
            length: s.len,
            lkey: s.lkey,
        },
        None => ffi::ibv_sge::default(),
    };
    let mut wr = ffi::ibv_recv_wr {
        wr_id,
        next: std::ptr::null_mut(),
        sg_list: &mut sge,
        num_sge: i32::from(buffer.is_some()),
    };
    let mut bad = std::ptr::null_mut();
    // SAFETY: one NULL-terminated request whose SGE lives on our stack for
    // the call; the buffer is the caller's contract.
    let rc = unsafe { ffi::ibv_post_recv(qp.as_ptr(), &mut wr, &mut bad) };
    #[cfg(test)]
    let (rc, bad) = fault::after_post(rc, bad);
    if rc != 0 {
        return Err(refused(Queue::Recv, std::slice::from_ref(&wr), bad, rc));
    }
    Ok(())
}

/// A fixed chain of receive work requests, re-posted in batches.
pub(crate) struct RecvChain {
    wrs: Box<[ffi::ibv_recv_wr]>,
    sges: Box<[ffi::ibv_sge]>,
}

// SAFETY: as for SendChain: pointers only into its own boxed arrays.
unsafe impl Send for RecvChain {}

impl std::fmt::Debug for RecvChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvChain")
            .field("capacity", &self.wrs.len())
            .finish()
    }
}

impl RecvChain {
    pub(crate) fn new(capacity: usize) -> RecvChain {
        assert!(capacity > 0, "a chain holds at least one work request");
        let mut sges: Box<[ffi::ibv_sge]> = vec![ffi::ibv_sge::default(); capacity].into();
        let mut wrs: Box<[ffi::ibv_recv_wr]> = sges
            .iter_mut()
            .map(|sge| ffi::ibv_recv_wr {
                wr_id: 0,
                next: std::ptr::null_mut(),
                sg_list: sge,
                num_sge: 1,
            })
            .collect();
        let base = wrs.as_mut_ptr();
        for (i, wr) in wrs.iter_mut().enumerate().take(capacity.saturating_sub(1)) {
            wr.next = base.wrapping_add(i.wrapping_add(1));
        }
        RecvChain { wrs, sges }
    }

    #[inline]
    pub(crate) fn capacity(&self) -> usize {
        self.wrs.len()
    }

    /// Writes receive `i`: `wr_id`, into `buffer` (or, with `None`, a
    /// receive without a buffer, for WRITE_WITH_IMM notifications).
    #[inline]
    pub(crate) fn patch(&mut self, i: usize, wr_id: u64, buffer: Option<LocalSlice>) {
        self.wrs[i].wr_id = wr_id;
        match buffer {
            Some(s) => {
                self.sges[i] = ffi::ibv_sge {
                    addr: s.addr,
                    length: s.len,
                    lkey: s.lkey,
                };
                self.wrs[i].num_sge = 1;
            }
            None => self.wrs[i].num_sge = 0,
        }
    }

    /// Posts receives `0..n` (patched) with one `ibv_post_recv`.
    ///
    /// # Safety
    /// Every patched buffer is memory the NIC may write until its receive
    /// completes (or the QP is destroyed), and nothing reads it meanwhile.
    #[inline]
    pub(crate) unsafe fn post(&mut self, qp: &mut QueuePair, n: usize) -> Result<(), PostFailed> {
        let qp = qp.as_ptr();
        // SAFETY: the caller's contract; qp is live (borrowed mutably).
        unsafe { self.post_with(Queue::Recv, n, |wrs, bad| ffi::ibv_post_recv(qp, wrs, bad)) }
    }

    /// Posts receives `0..n` (patched) to `poster`'s shared receive queue
    /// with one `ibv_post_srq_recv`.
    ///
    /// # Safety
    /// Every patched buffer is memory the NIC may write until its receive
    /// completes (or the SRQ is destroyed), and nothing reads it meanwhile.
    #[inline]
    pub(crate) unsafe fn post_shared(
        &mut self,
        poster: &mut SrqPoster,
        n: usize,
    ) -> Result<(), PostFailed> {
        let srq = poster.srq().as_ptr();
        // SAFETY: the caller's contract; the SRQ is live (held by the
        // poster, borrowed mutably: one post at a time).
        unsafe {
            self.post_with(Queue::SharedRecv, n, |wrs, bad| {
                ffi::ibv_post_srq_recv(srq, wrs, bad)
            })
        }
    }

    /// Posts receives `0..n` with `post` (the verb of `queue`).
    ///
    /// # Safety
    /// As for [`RecvChain::post`]; `post` is a live queue's post verb.
    #[inline(always)]
    unsafe fn post_with(
        &mut self,
        queue: Queue,
        n: usize,
        post: impl FnOnce(*mut ffi::ibv_recv_wr, *mut *mut ffi::ibv_recv_wr) -> i32,
    ) -> Result<(), PostFailed> {
        let last = n.wrapping_sub(1); // as in SendChain::post
        let saved = self.wrs[last].next;
        self.wrs[last].next = std::ptr::null_mut();
        let mut bad = std::ptr::null_mut();
        // Entries 0..n are initialised, linked and NULL-terminated; their
        // SGEs point into `sges`; the buffers are the caller's contract.
        let rc = post(self.wrs.as_mut_ptr(), &mut bad);
        #[cfg(test)]
        let (rc, bad) = fault::after_post(rc, bad);
        self.wrs[last].next = saved;
        if rc == 0 {
            return Ok(());
        }
        Err(refused(queue, &self.wrs[..n], bad, rc))
    }
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // counts of the tests' own
mod tests {
    use super::*;

    #[test]
    fn chains_are_linked_once_and_terminated() {
        let chain = SendChain::new(4);
        for i in 0..3 {
            assert_eq!(chain.wrs[i].next as *const _, &chain.wrs[i + 1] as *const _);
            assert_eq!(chain.wrs[i].sg_list as *const _, &chain.sges[i] as *const _);
        }
        assert!(chain.wrs[3].next.is_null());
        let rchain = RecvChain::new(3);
        assert_eq!(rchain.wrs[0].next as *const _, &rchain.wrs[1] as *const _);
        assert!(rchain.wrs[2].next.is_null());
    }

    #[test]
    fn patching_changes_only_the_per_operation_fields() {
        let mut chain = SendChain::new(2);
        let remote = RemoteSlice {
            addr: 0x1000,
            len: 64,
            rkey: 77,
        };
        let local = LocalSlice {
            addr: 0x2000,
            len: 32,
            lkey: 5,
        };
        chain.patch(
            1,
            &SendRequest {
                wr_id: 9,
                opcode: SendOpcode::WriteWithImm(0x0102_0304),
                payload: Payload::Registered(local),
                remote,
                signaled: true,
            },
        );
        let wr = &chain.wrs[1];
        assert_eq!((wr.wr_id, wr.opcode, wr.send_flags), (9, 1, 2));
        // SAFETY: patch just wrote both union members read here.
        let (rdma, imm) = unsafe { (wr.wr.rdma, wr.__bindgen_anon_1.imm_data) };
        assert_eq!((rdma.remote_addr, rdma.rkey), (0x1000, 77));
        assert_eq!(imm, 0x0102_0304u32.to_be());
        assert_eq!(
            (chain.sges[1].addr, chain.sges[1].length, chain.sges[1].lkey),
            (0x2000, 32, 5)
        );
        assert!(chain.wrs[1].next.is_null(), "links untouched");
        assert_eq!(chain.wrs[0].next as *const _, &chain.wrs[1] as *const _);

        let data = [7u8; 16];
        chain.patch(
            0,
            &SendRequest {
                wr_id: 10,
                opcode: SendOpcode::Send,
                payload: Payload::Inline(&data),
                remote: RemoteSlice::default(),
                signaled: false,
            },
        );
        assert_eq!(chain.wrs[0].send_flags, 8, "inline, unsignaled");
        assert_eq!(chain.sges[0].addr, data.as_ptr() as u64);
    }

    #[test]
    fn a_refused_request_is_found_by_its_position_and_an_unnamed_one_is_unknown() {
        let list = [0u64; 4];
        assert_eq!(position(&list, &list[2]), Some(2));
        assert_eq!(position(&list, &list[0]), Some(0));
        // rxe after a failed doorbell: every request was queued.
        assert_eq!(position(&list, std::ptr::null()), None);
        let elsewhere = 5u64;
        assert_eq!(position(&list, &elsewhere), None);
        let past_the_end = list.as_ptr().wrapping_add(4);
        assert_eq!(position(&list, past_the_end), None);
        let unknown = |failed| match failed {
            PostFailed::Unknown(u) => u,
            other => panic!("expected an unknown outcome, got {other:?}"),
        };
        let failed = unknown(refused(Queue::Send, &list, std::ptr::null(), 5));
        assert_eq!(
            (failed.requests, failed.call, failed.errno),
            (4, "ibv_post_send", 5)
        );
        let failed = unknown(refused(Queue::Recv, &[7u64, 8], &8u64, 12));
        assert_eq!(
            (failed.requests, failed.call),
            (2, "ibv_post_recv"),
            "a pointer outside the list"
        );
        match refused(Queue::Recv, &[7u64, 8], &list[1], 12) {
            PostFailed::Unknown(_) => {}
            other => panic!("another list's element names none of this one: {other:?}"),
        }
        let list = [7u64, 8, 9];
        match refused(Queue::Send, &list, &list[1], 12) {
            PostFailed::Refused {
                posted: 1,
                error: Error::PostSend { wr_id: 8, .. },
            } => {}
            other => panic!("expected 1 posted and 8 refused, got {other:?}"),
        }
    }

    #[test]
    fn opcodes_map_to_verbs_values() {
        assert_eq!(SendOpcode::Write.raw(), 0);
        assert_eq!(SendOpcode::WriteWithImm(1).raw(), 1);
        assert_eq!(SendOpcode::Send.raw(), 2);
        assert_eq!(SendOpcode::Read.raw(), 4);
    }
}
