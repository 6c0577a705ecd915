//! Pre-built work-request chains: arrays of `ibv_send_wr` / `ibv_recv_wr`
//! and their scatter/gather entries, allocated and linked once at setup.
//! Per operation only the fields that change are patched, and a batch of up
//! to `capacity` requests goes to the NIC with one `ibv_post_send` — one
//! doorbell.

use std::marker::PhantomData;
use std::mem::MaybeUninit;

use super::ffi;
use super::mr::{LocalSlice, RemoteSlice};
use super::qp::{QueuePair, SendFlags};
use crate::completion::WcOpcode;
use crate::error::{Error, Result};

/// What one send-queue work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOpcode {
    Send,
    Write,
    WriteWithImm(u32),
    Read,
}

impl SendOpcode {
    fn raw(self) -> u32 {
        match self {
            SendOpcode::Send => ffi::ibv_wr_opcode::IBV_WR_SEND,
            SendOpcode::Write => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            SendOpcode::WriteWithImm(_) => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
            SendOpcode::Read => ffi::ibv_wr_opcode::IBV_WR_RDMA_READ,
        }
    }

    /// The opcode its completion will carry.
    pub fn completion_opcode(self) -> WcOpcode {
        match self {
            SendOpcode::Send => WcOpcode::SEND,
            SendOpcode::Write | SendOpcode::WriteWithImm(_) => WcOpcode::RDMA_WRITE,
            SendOpcode::Read => WcOpcode::RDMA_READ,
        }
    }
}

/// The local side of a send work request.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'d> {
    /// Registered memory, read (or for READ, written) by the NIC.
    Registered(LocalSlice),
    /// Bytes the CPU copies into the WQE at post time (`IBV_SEND_INLINE`);
    /// they only need to live until the batch is posted.
    Inline(&'d [u8]),
}

/// One work request to add to a batch.
#[derive(Debug, Clone, Copy)]
pub struct SendRequest<'d> {
    pub wr_id: u64,
    pub opcode: SendOpcode,
    pub payload: Payload<'d>,
    /// Required for Write, WriteWithImm and Read; ignored for Send.
    pub remote: Option<RemoteSlice>,
    pub signaled: bool,
}

/// A fixed chain of send work requests, linked once.
pub struct SendChain {
    // Boxed so the addresses the WRs point at (next, sg_list) never move.
    wrs: Box<[ffi::ibv_send_wr]>,
    sges: Box<[ffi::ibv_sge]>,
}

// SAFETY: the chain's raw pointers point only into its own boxed arrays
// (and, transiently during a batch, at data the batch borrows); moving the
// owner to another thread moves all of them together.
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
    pub fn new(capacity: usize) -> SendChain {
        assert!(capacity > 0, "a chain holds at least one work request");
        // SAFETY: ibv_send_wr and ibv_sge are plain data; zero is valid.
        let zero_wr = || unsafe { MaybeUninit::<ffi::ibv_send_wr>::zeroed().assume_init() };
        let mut wrs: Box<[ffi::ibv_send_wr]> = (0..capacity).map(|_| zero_wr()).collect();
        let mut sges: Box<[ffi::ibv_sge]> = (0..capacity)
            .map(|_| ffi::ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            })
            .collect();
        let wr_base = wrs.as_mut_ptr();
        for (i, wr) in wrs.iter_mut().enumerate() {
            wr.sg_list = &mut sges[i];
            wr.num_sge = 1;
            // SAFETY: i + 1 <= capacity: at most one past the end, which is
            // replaced by NULL just below for the last entry.
            wr.next = unsafe { wr_base.add(i + 1) };
        }
        wrs[capacity - 1].next = std::ptr::null_mut();
        SendChain { wrs, sges }
    }

    pub fn capacity(&self) -> usize {
        self.wrs.len()
    }

    /// Writes `req` into entry `i`, touching only the fields that change
    /// between operations; links and SGE pointers stay as built.
    #[inline]
    fn patch(&mut self, i: usize, req: &SendRequest<'_>, max_inline: u32) -> Result<()> {
        let (sge, inline) = match req.payload {
            Payload::Registered(s) => (
                ffi::ibv_sge {
                    addr: s.addr,
                    length: s.len,
                    lkey: s.lkey,
                },
                false,
            ),
            Payload::Inline(data) => {
                if data.len() > max_inline as usize || req.opcode == SendOpcode::Read {
                    return Err(not_inline(data.len(), max_inline));
                }
                (
                    ffi::ibv_sge {
                        addr: data.as_ptr() as u64,
                        length: data.len() as u32,
                        lkey: 0,
                    },
                    true,
                )
            }
        };
        let remote = match (req.opcode, req.remote) {
            (SendOpcode::Send, _) => None,
            (_, Some(r)) => Some(r),
            (_, None) => return Err(no_remote()),
        };
        self.sges[i] = sge;
        let wr = &mut self.wrs[i];
        wr.wr_id = req.wr_id;
        wr.opcode = req.opcode.raw();
        wr.send_flags = SendFlags {
            signaled: req.signaled,
            inline,
        }
        .bits();
        if let Some(remote) = remote {
            wr.wr.rdma.remote_addr = remote.addr;
            wr.wr.rdma.rkey = remote.rkey;
        }
        if let SendOpcode::WriteWithImm(imm) = req.opcode {
            wr.__bindgen_anon_1.imm_data = imm.to_be();
        }
        Ok(())
    }

    /// Posts `req` on its own from entry 0: one doorbell, no batch state —
    /// the fast path for operations that go one at a time (latency loops).
    /// Nothing is posted when `req` is malformed.
    #[inline]
    pub fn post_one(&mut self, qp: &mut QueuePair, req: &SendRequest<'_>) -> Result<()> {
        self.patch(0, req, qp.max_inline())?;
        self.post_prefix(qp, 1).map(drop)
    }

    /// Posts entries `0..n` (patched, `1 <= n <= capacity`) with a single
    /// `ibv_post_send`, terminating the list after entry `n - 1` for the
    /// call and restoring the link afterwards.
    #[inline]
    fn post_prefix(&mut self, qp: &mut QueuePair, n: usize) -> Result<usize> {
        let last = n - 1;
        let saved_next = self.wrs[last].next;
        self.wrs[last].next = std::ptr::null_mut();
        let mut bad = std::ptr::null_mut();
        // SAFETY: wrs[0..n] are initialised and linked, ending in NULL; their
        // sg_lists point into `sges`; inline data is borrowed by the caller
        // for at least this call (SendBatch: for 'd); registered payloads
        // are named by lkey and checked by the NIC. The provider copies the
        // WQEs before returning.
        let rc = unsafe { ffi::ibv_post_send(qp.as_ptr(), self.wrs.as_mut_ptr(), &mut bad) };
        self.wrs[last].next = saved_next;
        if rc != 0 {
            return Err(self.post_failed(bad, rc));
        }
        Ok(n)
    }

    /// On failure `bad` points at the first WR not posted, one of ours:
    /// find it by position rather than dereferencing it.
    #[cold]
    #[inline(never)]
    fn post_failed(&self, bad: *mut ffi::ibv_send_wr, rc: i32) -> Error {
        let index = (bad as usize).wrapping_sub(self.wrs.as_ptr() as usize)
            / std::mem::size_of::<ffi::ibv_send_wr>();
        let wr_id = self.wrs.get(index).unwrap_or(&self.wrs[0]).wr_id;
        Error::PostSend {
            wr_id,
            source: crate::error::errno(rc),
        }
    }

    /// Starts a batch on `qp`. Data borrowed by inline requests must live
    /// as long as `'d`, which outlasts the post.
    #[inline]
    pub fn batch<'q, 'd>(&'q mut self, qp: &'q mut QueuePair) -> SendBatch<'q, 'd> {
        SendBatch {
            chain: self,
            qp,
            len: 0,
            _data: PhantomData,
        }
    }
}

/// Requests being gathered for one `ibv_post_send`. Dropping it without
/// [`SendBatch::post`] posts nothing.
#[must_use = "a batch posts nothing until .post() is called"]
pub struct SendBatch<'q, 'd> {
    chain: &'q mut SendChain,
    qp: &'q mut QueuePair,
    len: usize,
    _data: PhantomData<&'d [u8]>,
}

impl std::fmt::Debug for SendBatch<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendBatch").field("len", &self.len).finish()
    }
}

impl<'d> SendBatch<'_, 'd> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len == self.chain.wrs.len()
    }

    /// Patches the next pre-built request. Fails when the batch is full or
    /// the request is malformed (missing remote, inline too large).
    #[inline]
    pub fn push(&mut self, req: SendRequest<'d>) -> Result<()> {
        if self.is_full() {
            return Err(batch_full(self.chain.wrs.len()));
        }
        let max_inline = self.qp.max_inline();
        self.chain.patch(self.len, &req, max_inline)?;
        self.len += 1;
        Ok(())
    }

    /// Posts every pushed request with a single `ibv_post_send`. Returns
    /// how many were posted (0 posts nothing and rings no doorbell).
    #[inline]
    pub fn post(self) -> Result<usize> {
        if self.len == 0 {
            return Ok(0);
        }
        self.chain.post_prefix(self.qp, self.len)
    }
}

// Errors are built out of line so the patching code stays small.
#[cold]
#[inline(never)]
fn not_inline(len: usize, max_inline: u32) -> Error {
    Error::Config(format!(
        "{len} bytes cannot go inline (QP max_inline_data {max_inline}; READ never inline)"
    ))
}

#[cold]
#[inline(never)]
fn no_remote() -> Error {
    Error::Config("RDMA operations need a remote slice".into())
}

#[cold]
#[inline(never)]
fn batch_full(capacity: usize) -> Error {
    Error::Config(format!("batch is full ({capacity} requests)"))
}

/// A fixed chain of receive work requests, re-posted in batches.
pub struct RecvChain {
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
    pub fn new(capacity: usize) -> RecvChain {
        assert!(capacity > 0, "a chain holds at least one work request");
        let mut sges: Box<[ffi::ibv_sge]> = (0..capacity)
            .map(|_| ffi::ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            })
            .collect();
        let mut wrs: Box<[ffi::ibv_recv_wr]> = (0..capacity)
            .map(|i| ffi::ibv_recv_wr {
                wr_id: 0,
                next: std::ptr::null_mut(),
                sg_list: &mut sges[i],
                num_sge: 1,
            })
            .collect();
        let base = wrs.as_mut_ptr();
        for i in 0..capacity - 1 {
            // SAFETY: i + 1 < capacity: in bounds.
            wrs[i].next = unsafe { base.add(i + 1) };
        }
        RecvChain { wrs, sges }
    }

    pub fn capacity(&self) -> usize {
        self.wrs.len()
    }

    /// Posts one receive per item (at most `capacity`) with a single
    /// `ibv_post_recv`; `None` buffers post zero-SGE receives.
    #[inline]
    pub fn post(
        &mut self,
        qp: &mut QueuePair,
        items: impl IntoIterator<Item = (u64, Option<LocalSlice>)>,
    ) -> Result<usize> {
        let mut n = 0;
        for (wr_id, slice) in items.into_iter().take(self.wrs.len()) {
            self.wrs[n].wr_id = wr_id;
            match slice {
                Some(s) => {
                    self.sges[n] = ffi::ibv_sge {
                        addr: s.addr,
                        length: s.len,
                        lkey: s.lkey,
                    };
                    self.wrs[n].num_sge = 1;
                }
                None => self.wrs[n].num_sge = 0,
            }
            n += 1;
        }
        if n == 0 {
            return Ok(0);
        }
        let saved = self.wrs[n - 1].next;
        self.wrs[n - 1].next = std::ptr::null_mut();
        let mut bad = std::ptr::null_mut();
        // SAFETY: wrs[0..n] are initialised, linked and NULL-terminated;
        // their sg_lists point into `sges`; receive buffers are named by
        // lkey and checked by the NIC.
        let rc = unsafe { ffi::ibv_post_recv(qp.as_ptr(), self.wrs.as_mut_ptr(), &mut bad) };
        self.wrs[n - 1].next = saved;
        if rc != 0 {
            return Err(Error::PostRecv {
                wr_id: self.wrs[0].wr_id,
                source: crate::error::errno(rc),
            });
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layout the NIC driver reads must be the C one (64-bit Linux).
    #[test]
    fn verbs_structs_have_the_c_layout() {
        assert_eq!(std::mem::size_of::<ffi::ibv_sge>(), 16);
        assert_eq!(std::mem::size_of::<ffi::ibv_recv_wr>(), 32);
        assert_eq!(std::mem::size_of::<ffi::ibv_send_wr>(), 128);
        assert_eq!(std::mem::size_of::<ffi::ibv_wc>(), 48);
        assert_eq!(std::mem::size_of::<super::super::cq::WorkCompletion>(), 48);
    }

    #[test]
    fn send_chain_is_linked_once_and_terminated() {
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
        let req = SendRequest {
            wr_id: 9,
            opcode: SendOpcode::WriteWithImm(0x0102_0304),
            payload: Payload::Registered(local),
            remote: Some(remote),
            signaled: true,
        };
        chain.patch(1, &req, 0).unwrap();
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
        let inline = SendRequest {
            wr_id: 10,
            opcode: SendOpcode::Send,
            payload: Payload::Inline(&data),
            remote: None,
            signaled: false,
        };
        chain.patch(0, &inline, 64).unwrap();
        assert_eq!(chain.wrs[0].send_flags, 8, "inline, unsignaled");
        assert_eq!(chain.sges[0].addr, data.as_ptr() as u64);
        assert!(chain
            .patch(0, &inline, 8)
            .unwrap_err()
            .to_string()
            .contains("16 bytes cannot go inline"));
        let no_remote = SendRequest {
            opcode: SendOpcode::Read,
            payload: Payload::Registered(local),
            remote: None,
            ..inline
        };
        assert!(chain.patch(0, &no_remote, 64).is_err());
    }

    #[test]
    fn opcodes_map_to_verbs_values_and_completions() {
        assert_eq!(SendOpcode::Write.raw(), 0);
        assert_eq!(SendOpcode::WriteWithImm(1).raw(), 1);
        assert_eq!(SendOpcode::Send.raw(), 2);
        assert_eq!(SendOpcode::Read.raw(), 4);
        assert_eq!(
            SendOpcode::WriteWithImm(1).completion_opcode(),
            WcOpcode::RDMA_WRITE
        );
        assert_eq!(SendOpcode::Read.completion_opcode(), WcOpcode::RDMA_READ);
    }
}
