//! rdma_cm connections accepted onto a poller without waiting: the
//! request's id moves to the poller's one event channel, its queue pair
//! is made on the poller's queues, `rdma_accept` is sent, and the poller's
//! turn takes the rest (ESTABLISHED, a disconnect, a handshake that never
//! completes) from that channel, each event told apart by the tag its id
//! carries. No peer can hold the poller: nothing here waits for one.

use std::sync::Arc;
use std::time::Instant;

use super::event::{EndCause, PoolEvent};
use super::poller::{Joining, Poller};
use super::slab::ConnId;
use crate::connect::cm::ConnectRequest;
use crate::connect::RegionDescriptor;
use crate::error::{Error, Result};
use crate::sys::cm::{event, CmEvent, CmId, ConnParam, EventChannel};
use crate::sys::mr::{Access, RemoteSlice};

/// CM events taken per turn at most: a burst of handshakes shares the
/// turn with the data path.
const CM_EVENTS_PER_TURN: usize = 16;
/// Busy turns between looks at the CM channel (each a system call); an
/// idle turn looks at once.
const CM_EVERY: u32 = 64;

/// The tag an accepted connection's id carries: bit 63 (0 is an id
/// never tagged), its generation (32 bits), its slot (16 bits: a poller
/// has at most 2^16).
fn tag_of(id: ConnId) -> u64 {
    debug_assert!(id.index <= 0xffff);
    1 << 63 | u64::from(id.gen) << 16 | u64::from(id.index & 0xffff)
}

fn untag(tag: u64) -> Option<ConnId> {
    (tag >> 63 == 1).then_some(ConnId {
        index: (tag & 0xffff) as u32,
        gen: (tag >> 16) as u32,
    })
}

/// How far a turn read the CM channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CmRead {
    /// Not looked at this turn (a busy turn), or this poller has none.
    Skipped,
    /// Looked at; more than a turn's share was there.
    Partly,
    /// Looked at and read to the end.
    Emptied,
}

/// What a client hears when the server turns its request down for a
/// reason of its own.
const BUSY: &[u8] = b"server: cannot serve this connection now; try again later\0";

impl Poller {
    /// Accepts `request` onto this poller, its peer allowed
    /// `remote_access` to the connection's target ring, and returns at
    /// once: the connection is usable now (its queue pair is at RTS), and
    /// [`PoolEvent::Joined`] follows once rdma_cm says it is established;
    /// one not established within the QP configuration's
    /// `connect_timeout` ends ([`EndCause::HandshakeTimedOut`]).
    ///
    /// The client's private data must start with its target ring's
    /// descriptor (what [`ConnectionBuilder::connect`](crate::ConnectionBuilder)
    /// sends); the reply carries this side's. Refused, and the client
    /// rejected, before any verb: a request of another device, bad private
    /// data, a full poller ([`Error::PoolFull`]).
    pub(crate) fn accept(
        &mut self,
        request: ConnectRequest,
        remote_access: Access,
    ) -> Result<ConnId> {
        let (mut cm_id, request) = request.into_parts();
        let refuse = |why: &[u8], error: Error| {
            let _ = cm_id.reject(why);
            Err(error)
        };
        let Some(channel) = self.cm.clone() else {
            return refuse(
                BUSY,
                Error::Cm {
                    op: "accepting onto a poller whose device was opened without rdma_cm",
                    source: std::io::Error::from_raw_os_error(libc::ENOSYS),
                },
            );
        };
        let peer = match RegionDescriptor::decode(&request.private_data) {
            Ok(descriptor) => descriptor.0,
            Err(e) => {
                return refuse(
                    b"client: the private data must start with a ring descriptor\0",
                    e,
                )
            }
        };
        let ours = self.pd.context();
        // The id's context holds the id (its keepalive): dropped at once,
        // so the id's handle is unique again for its tag below.
        let theirs = cm_id.context().map(|c| (c.as_ptr(), c.name().to_owned()));
        if theirs.as_ref().map(|(ptr, _)| *ptr) != Some(ours.as_ptr()) {
            let got = theirs.map_or_else(|| "none".to_owned(), |(_, name)| name);
            return refuse(
                BUSY,
                Error::WrongDevice {
                    wanted: ours.name().to_owned(),
                    got,
                },
            );
        }
        let id = match self.reserve() {
            Ok(id) => id,
            Err(full) => return refuse(BUSY, full),
        };
        // Failed, its id and queue pair are gone: the client hears a
        // reject.
        // Tagged while only this request's owner holds its id (and its
        // own channel), before any event of it can be taken elsewhere.
        if !CmId::set_tag(&mut cm_id, tag_of(id)) {
            let shared = Error::Cm {
                op: "tagging a connect request's id held elsewhere too",
                source: std::io::Error::from_raw_os_error(libc::EBUSY),
            };
            return self.settle_join(Err(Joining::Failed(shared)));
        }
        let accepted = self.accept_booked(id, cm_id, &channel, &request, peer, remote_access);
        self.settle_join(accepted)
    }

    fn accept_booked(
        &mut self,
        id: ConnId,
        cm_id: Arc<CmId>,
        channel: &Arc<EventChannel>,
        request: &CmEvent,
        peer: RemoteSlice,
        remote_access: Access,
    ) -> std::result::Result<ConnId, Joining> {
        cm_id.migrate(channel)?;
        let (ep, rings) = self.endpoint_and_rings(Some(Arc::clone(&cm_id)), remote_access)?;
        let reply = RegionDescriptor(rings.2.remote(0..rings.2.len())?).encode();
        let cfg = &self.cfg;
        cm_id.set_ack_timeout(cfg.qp.timeout)?;
        let depth = cfg.qp.max_rd_atomic;
        let param = ConnParam {
            private_data: &reply,
            responder_resources: request.initiator_depth.min(depth),
            initiator_depth: request.responder_resources.min(depth),
            retry_count: cfg.qp.retry_count,
            rnr_retry_count: cfg.qp.rnr_retry,
        };
        // Too far to represent: no deadline.
        let deadline = Instant::now().checked_add(cfg.qp.connect_timeout);
        let mut conn = self.pooled(id, ep, rings, Some(peer));
        // rdma_accept moves the queue pair to RTR and RTS before it sends
        // the reply: from here on it may hold a receive of the shared queue.
        if let Err(e) = cm_id.accept(&param) {
            self.end_join(id, conn);
            return Err(Joining::Ended(e));
        }
        conn.ep.mark_connected(Vec::new(), Some(peer));
        conn.handshaking = true;
        conn.handshake = deadline;
        let id = self.admit(id, conn)?;
        debug_assert!(self.handshaking.len() < self.handshaking.capacity());
        self.handshaking.push(id);
        Ok(id)
    }

    /// Takes what the CM channel holds (when the turn was idle, or every
    /// [`CM_EVERY`] turns): an accepted connection established, or one
    /// whose peer disconnected or whose handshake failed, marked to end.
    pub(super) fn poll_cm(
        &mut self,
        idle: bool,
        on: &mut impl FnMut(ConnId, PoolEvent<'_>),
    ) -> Result<CmRead> {
        let Some(channel) = &self.cm else {
            return Ok(CmRead::Skipped);
        };
        self.cm_countdown = self.cm_countdown.saturating_sub(1);
        if !idle && self.cm_countdown > 0 {
            return Ok(CmRead::Skipped);
        }
        self.cm_countdown = CM_EVERY;
        let channel = Arc::clone(channel);
        for _ in 0..CM_EVENTS_PER_TURN {
            let Some(ev) = channel.try_event()? else {
                return Ok(CmRead::Emptied);
            };
            // Late events of a connection that ended name a stale id.
            let Some(id) = untag(ev.tag) else {
                continue;
            };
            let Some(conn) = self.slab.get_mut(id) else {
                continue;
            };
            match ev.kind {
                event::ESTABLISHED if conn.handshaking => {
                    conn.handshaking = false;
                    conn.handshake = None;
                    self.tell(id, PoolEvent::Joined, on);
                }
                event::DISCONNECTED | event::DEVICE_REMOVAL => {
                    conn.mark_end(id, EndCause::Disconnected, &mut self.to_end);
                }
                event::CONNECT_ERROR | event::UNREACHABLE | event::REJECTED => {
                    conn.mark_end(id, EndCause::HandshakeFailed, &mut self.to_end);
                }
                _ => tracing::debug!(event = ev.name(), "a pooled connection's CM event"),
            }
        }
        // Look again next turn: more may be waiting.
        self.cm_countdown = 0;
        Ok(CmRead::Partly)
    }

    /// Marks the accepted connections whose handshake passed its deadline
    /// to end, and forgets those established or ended.
    pub(super) fn expire_handshakes(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.handshaking.len() {
            let id = self.handshaking[i];
            match self.slab.get_mut(id) {
                Some(conn) if conn.end.is_none() && conn.handshaking => {
                    if conn.handshake.is_some_and(|deadline| now >= deadline) {
                        conn.mark_end(id, EndCause::HandshakeTimedOut, &mut self.to_end);
                    } else {
                        i += 1;
                        continue;
                    }
                }
                _ => {}
            }
            self.handshaking.swap_remove(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tag_names_its_slot_and_generation_and_an_untagged_id_nothing() {
        for id in [
            ConnId { index: 0, gen: 0 },
            ConnId {
                index: 65_535,
                gen: u32::MAX,
            },
            ConnId { index: 7, gen: 3 },
        ] {
            assert_eq!(untag(tag_of(id)), Some(id));
        }
        assert_eq!(untag(0), None, "an id never tagged");
    }
}
