//! Posting one request: the `try_*` calls post now or refuse with
//! [`Error::Full`] (one doorbell, no batch state, no clock read); the
//! waiting ones reap completions around them until there is room.

use super::Connection;
use crate::error::{Error, Remedy, Result};
use crate::sys::send_queue::{Outbound, ReadTicket};
use crate::wait::BoundedWait;

impl Connection {
    /// SEND `data` on its own, now or not at all: [`Error::Full`] when the
    /// send queue (or, above the inline threshold, the send ring) has no
    /// room — reap completions and retry. Returns its sequence number.
    ///
    /// ```no_run
    /// # fn run(conn: &mut pinpoll::Connection) -> pinpoll::Result<u64> {
    /// let seq = loop {
    ///     match conn.try_send(b"tick") {
    ///         Ok(seq) => break seq,
    ///         // Nothing was posted: retire completions, call again.
    ///         Err(e) if e.is_retryable() => {
    ///             conn.reap()?;
    ///         }
    ///         Err(e) => return Err(e),
    ///     }
    /// };
    /// # Ok(seq) }
    /// ```
    #[inline]
    pub fn try_send(&mut self, data: &[u8]) -> Result<u64> {
        self.post_bytes(Outbound::Send, data, false)
    }

    /// RDMA WRITE (with `imm`: WRITE_WITH_IMM) of `data` to `remote_offset`
    /// of the peer's target ring, now or not at all; see [`try_send`].
    ///
    /// [`try_send`]: Connection::try_send
    #[inline]
    pub fn try_write(&mut self, data: &[u8], remote_offset: u64, imm: Option<u32>) -> Result<u64> {
        self.write_one(data, remote_offset, imm, false)
    }

    /// RDMA WRITE (with `imm`: WRITE_WITH_IMM) of `len` bytes that `fill`
    /// writes straight into a registered send-ring slot, now or not at all:
    /// no copy of a payload that is already where it belongs. An error
    /// from `fill` posts nothing.
    #[inline]
    pub fn try_write_from(
        &mut self,
        len: usize,
        remote_offset: u64,
        imm: Option<u32>,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> Result<u64> {
        self.check_failure()?;
        let remote = self.peer.sub(remote_offset, len as u64)?;
        let op = Outbound::Write { remote, imm };
        let seq = self.sq.post_filled(self.ep.qp(), op, len, false, fill)?;
        self.stats.doorbells += 1;
        Ok(seq)
    }

    /// RDMA READ of `len` bytes at `remote_offset` of the peer's target
    /// ring, now or not at all; the data arrive with
    /// [`Event::ReadCompleted`](super::Event::ReadCompleted) for the
    /// returned sequence number.
    #[inline]
    pub fn try_read(&mut self, remote_offset: u64, len: usize) -> Result<u64> {
        Ok(self.read_one(remote_offset, len)?.seq)
    }

    #[cfg(feature = "engine")]
    /// SEND, signaled whatever the interval says when `must_signal` (the
    /// engine's worker, for an op the application asked a completion of).
    #[inline]
    pub(crate) fn send_one(&mut self, data: &[u8], must_signal: bool) -> Result<u64> {
        self.post_bytes(Outbound::Send, data, must_signal)
    }

    /// WRITE, signaled when `must_signal` (see [`Connection::send_one`]).
    #[inline]
    pub(crate) fn write_one(
        &mut self,
        data: &[u8],
        remote_offset: u64,
        imm: Option<u32>,
        must_signal: bool,
    ) -> Result<u64> {
        let remote = self.peer.sub(remote_offset, data.len() as u64)?;
        self.post_bytes(Outbound::Write { remote, imm }, data, must_signal)
    }

    #[inline]
    pub(crate) fn read_one(&mut self, remote_offset: u64, len: usize) -> Result<ReadTicket> {
        self.check_failure()?;
        let remote = self.peer.sub(remote_offset, len as u64)?;
        let ticket = self.sq.post_read(self.ep.qp(), remote, len)?;
        self.stats.doorbells += 1;
        Ok(ticket)
    }

    #[inline(always)]
    fn post_bytes(&mut self, op: Outbound, data: &[u8], must_signal: bool) -> Result<u64> {
        self.check_failure()?;
        let seq = self.sq.post_bytes(self.ep.qp(), op, data, must_signal)?;
        self.stats.doorbells += 1;
        Ok(seq)
    }

    /// SEND `data` on its own (one doorbell), reaping completions while the
    /// send queue or the send ring is full. Returns its sequence number.
    #[inline]
    pub fn send(&mut self, data: &[u8]) -> Result<u64> {
        self.with_room(|c| c.try_send(data))
    }

    /// RDMA WRITE `data` to `remote_offset` of the peer's target ring, with
    /// an optional immediate (which consumes a receive at the peer).
    #[inline]
    pub fn write(&mut self, data: &[u8], remote_offset: u64, imm: Option<u32>) -> Result<u64> {
        self.with_room(|c| c.try_write(data, remote_offset, imm))
    }

    /// RDMA READ `len` bytes at `remote_offset` of the peer's target ring,
    /// waiting for the data. They stay readable until the next call that
    /// takes `&mut self`.
    #[inline]
    pub fn read(&mut self, remote_offset: u64, len: usize) -> Result<&[u8]> {
        let ticket = self.with_room(|c| c.read_one(remote_offset, len))?;
        self.wait_retired(ticket.seq)?;
        self.sq.read_data(ticket).ok_or(Error::Full {
            what: "the read ring (the READ's slot was taken again)",
            remedy: Remedy::Poll,
        })
    }

    /// Runs `post` until it is not refused for lack of room, reaping
    /// completions in between, within the completion timeout.
    #[inline]
    pub(super) fn with_room<T>(
        &mut self,
        mut post: impl FnMut(&mut Self) -> Result<T>,
    ) -> Result<T> {
        let mut wait = BoundedWait::new(self.completion_timeout, "send-queue room");
        loop {
            match post(self) {
                Err(Error::Full { .. }) => {
                    if self.reap()? == 0 {
                        self.stats.wait_turns += 1;
                        if let Some(waited) = wait.tick()? {
                            self.check_peer(waited)?;
                        }
                    }
                }
                // A failure names why the connection ended, when it did.
                done => return done.map_err(|e| self.ended_error(e)),
            }
        }
    }
}
