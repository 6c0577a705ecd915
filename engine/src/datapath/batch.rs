//! Several requests, one doorbell: a [`Batch`] borrows the connection,
//! gathers up to `batch_size` requests and posts them with one
//! `ibv_post_send`.

use super::{Connection, Stats};
use crate::error::{Error, Result};
use crate::status::WcError;
use crate::sys::mr::RemoteSlice;
use crate::sys::region::{MemoryRegion, RegionRefused};
use crate::sys::send_queue::{Outbound, SendBatch};

/// Requests gathered for one doorbell. Dropping it unposted forgets them
/// (the accounting rolls back); nothing reaches the NIC.
#[must_use = "a batch posts nothing until .post() is called"]
pub struct Batch<'c, 'd> {
    inner: SendBatch<'c, 'd>,
    peer: RemoteSlice,
    failure: Option<WcError>,
    stats: &'c mut Stats,
    force_signal: bool,
}

impl std::fmt::Debug for Batch<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batch").field("len", &self.len()).finish()
    }
}

impl Connection {
    /// Starts a batch: up to `batch_size` requests, one doorbell.
    ///
    /// ```no_run
    /// # fn run(conn: &mut pinpoll::Connection, chunks: &[Vec<u8>]) -> pinpoll::Result<()> {
    /// use pinpoll::ErrorKind;
    ///
    /// let mut next = 0;
    /// while next < chunks.len() {
    ///     let mut batch = conn.batch();
    ///     while let Some(chunk) = chunks.get(next) {
    ///         match batch.write(chunk, (next * 4096) as u64, None) {
    ///             Ok(_) => next += 1,
    ///             // Full batch, or a queue full while it held the
    ///             // connection: post it, then make room.
    ///             Err(e) if e.kind() == ErrorKind::BatchFull => break,
    ///             Err(e) => return Err(e),
    ///         }
    ///     }
    ///     batch.post()?; // one doorbell
    ///     conn.reap()?; // retire what completed
    /// }
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn batch<'d>(&mut self) -> Batch<'_, 'd> {
        Batch {
            inner: self.sq.batch(self.ep.qp()),
            peer: self.peer,
            failure: self.failure,
            stats: &mut self.stats,
            force_signal: false,
        }
    }
}

impl<'d> Batch<'_, 'd> {
    /// Requests added so far: at most the connection's `batch_size`, past
    /// which an add is [`Error::BatchFull`].
    pub fn len(&self) -> usize {
        self.inner.len()
    }

    /// Whether no request was added: posting the batch then rings no
    /// doorbell.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Requests a completion for the next request pushed.
    pub fn signal_next(&mut self) -> &mut Self {
        self.force_signal = true;
        self
    }

    /// Refuses new requests once the connection failed, with the failure
    /// as recorded (`Error::Completion`): a batch cannot afford to carry
    /// the connection's end, which the connection's own calls name; takes
    /// the pending signal request.
    #[inline(always)]
    fn start(&mut self) -> Result<bool> {
        if let Some(f) = self.failure {
            return Err(Error::Completion(f));
        }
        Ok(std::mem::take(&mut self.force_signal))
    }

    /// Adds a SEND of `data` (inline when small, else via the send ring).
    #[inline]
    pub fn send(&mut self, data: &'d [u8]) -> Result<u64> {
        let signal = self.start()?;
        self.inner.push_bytes(Outbound::Send, data, signal)
    }

    /// Adds a SEND of `len` bytes that `fill` writes straight into a
    /// registered send-ring slot (see [`Batch::write_from`]).
    #[inline]
    pub fn send_from(
        &mut self,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<u64> {
        let signal = self.start()?;
        self.inner.push_filled(Outbound::Send, len, signal, fill)
    }

    /// Adds an RDMA WRITE (with an immediate: WRITE_WITH_IMM) of `data` to
    /// `remote_offset` in the peer's target ring.
    #[inline]
    pub fn write(&mut self, data: &'d [u8], remote_offset: u64, imm: Option<u32>) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, data.len() as u64)?;
        self.write_remote(data, remote, imm)
    }

    /// Adds an RDMA WRITE of `data` to any region the peer advertised
    /// (not only its target ring). Nothing local can check `remote`: a
    /// wrong one fails at the peer's NIC with REM_ACCESS_ERR.
    #[inline]
    pub fn write_remote(
        &mut self,
        data: &'d [u8],
        remote: RemoteSlice,
        imm: Option<u32>,
    ) -> Result<u64> {
        let remote = remote.sub(0, data.len() as u64)?;
        let signal = self.start()?;
        self.inner
            .push_bytes(Outbound::Write { remote, imm }, data, signal)
    }

    /// Adds an RDMA WRITE (with `imm`: WRITE_WITH_IMM) of `len` bytes that
    /// `fill` writes straight into a registered send-ring slot — e.g. a
    /// file read with no intermediate buffer. An error from `fill` adds
    /// nothing.
    #[inline]
    pub fn write_from(
        &mut self,
        len: usize,
        remote_offset: u64,
        imm: Option<u32>,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, len as u64)?;
        let signal = self.start()?;
        self.inner
            .push_filled(Outbound::Write { remote, imm }, len, signal, fill)
    }

    /// Adds an RDMA WRITE (with `imm`: WRITE_WITH_IMM) of the first `len`
    /// bytes of `region` to `remote_offset` in the peer's target ring, sent
    /// from `region` itself: no copy into the send ring. The connection
    /// keeps the region until the request retires, then
    /// [`Connection::reclaim`] gives it back; a refusal gives it back in
    /// the error. For payloads produced elsewhere (another thread reading
    /// a file into registered memory) that should reach the wire untouched.
    // The region comes back in the error unboxed: a refusal for lack of
    // room is ordinary back-pressure, and must not allocate.
    #[allow(clippy::result_large_err)]
    #[inline]
    pub fn write_region(
        &mut self,
        region: MemoryRegion,
        len: usize,
        remote_offset: u64,
        imm: Option<u32>,
    ) -> std::result::Result<u64, RegionRefused> {
        let checked = self
            .peer
            .sub(remote_offset, len as u64)
            .and_then(|remote| Ok((remote, self.start()?)));
        let (remote, signal) = match checked {
            Ok(checked) => checked,
            Err(error) => return Err(RegionRefused { error, region }),
        };
        self.inner
            .push_region(Outbound::Write { remote, imm }, region, len, signal)
    }

    /// Adds an RDMA READ of `len` bytes at `remote_offset` of the peer's
    /// target ring; the data arrive with
    /// [`Event::ReadCompleted`](super::Event::ReadCompleted).
    #[inline]
    pub fn read(&mut self, remote_offset: u64, len: usize) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, len as u64)?;
        self.start()?;
        self.inner.push_read(remote, len)
    }

    /// Posts the batch with one doorbell. Returns how many requests went.
    /// If the provider refuses one, those before it stay posted (the
    /// error's `posted` says how many) and the rest are given back.
    #[inline]
    pub fn post(self) -> Result<usize> {
        let stats = self.stats;
        let result = self.inner.post();
        let rang = match &result {
            Ok(n) => *n > 0,
            Err(Error::PostSend { .. }) => true,
            Err(_) => false,
        };
        stats.doorbells += u64::from(rang);
        result
    }
}
