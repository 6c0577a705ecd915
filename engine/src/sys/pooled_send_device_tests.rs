//! Device tests of send queues that share one CQ (issue 25's poller):
//! each names its requests with its connection's slot and generation
//! ([`PooledIds`]), so a completion of another queue on the same CQ —
//! also of a queue in the same slot one generation apart, whose sequence
//! numbers are the very same — retires nothing of it. Run in the guest
//! like the other device tests.

use std::sync::Arc;
use std::time::Duration;

use super::cq::{CompletionQueue, Reaper, POLL_BATCH};
use super::device::Context;
use super::layout::SlotLayout;
use super::mr::{Access, Registration, RemoteSlice};
use super::pd::ProtectionDomain;
use super::qp::Queues;
use super::region::SharedRegion;
use super::send_names::PooledIds;
use super::send_queue::{Outbound, SendQueue};
use super::shared_queue_device_tests::{connect_exposing, device};
use super::wr_id;
use crate::config::PageSize;
use crate::datapath::device_tests::pattern;
use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::status::WcStatus;
use crate::wait::BoundedWait;

const WAIT: Duration = Duration::from_secs(10);
/// The peer's region: WRITEs land at the start, READs read the second half.
const REGION: usize = 4096;
const READ_AT: usize = REGION / 2;
const READ_LEN: usize = 300;

/// One connection on the shared CQ, in drop order: our QP goes before
/// the rings its requests name, the peer's QP before its region.
struct Pooled {
    ours: Endpoint,
    sq: SendQueue<PooledIds>,
    names: PooledIds,
    remote: RemoteSlice,
    _peer: Endpoint,
    region: SharedRegion,
    /// What the peer's region held at the start.
    initial: Vec<u8>,
    /// Sequence numbers retired, in order, and each READ's data.
    retired: Vec<u64>,
    reads: Vec<Vec<u8>>,
}

impl Pooled {
    fn connect(pd: &Arc<ProtectionDomain>, queues: Queues<'_>, names: PooledIds, seed: u8) -> Self {
        let initial = pattern(REGION, seed);
        let (ours, peer, region) = connect_exposing(pd, queues, Some(initial.clone()));
        let remote = ours.remote_region().expect("the peer's region");
        let layout = SlotLayout::new(1024, 8).expect("a layout");
        let ring =
            |access| Registration::new(pd, layout.bytes(), PageSize::Base, access).expect("a ring");
        let rings = (ring(Access::LOCAL_READ), ring(Access::LOCAL_WRITE), layout);
        let cq = queues.send_cq.id();
        let sq = SendQueue::named(cq, names, rings, 8, 2, 4, 0);
        Pooled {
            ours,
            sq,
            names,
            remote,
            _peer: peer,
            region: region.expect("the peer's region"),
            initial,
            retired: Vec::new(),
            reads: Vec::new(),
        }
    }

    /// Two WRITEs on their own (the first unsignaled: the second's
    /// completion retires it), a READ, and a batch of two WRITEs (one of
    /// zero bytes): five requests.
    fn post(&mut self, written: &[u8]) {
        let remote = self.remote;
        let at = |offset: usize, len: usize| RemoteSlice {
            addr: remote.addr + offset as u64,
            len: len as u64,
            ..remote
        };
        let write = |offset: usize, len: usize| Outbound::Write {
            remote: at(offset, len),
            imm: None,
        };
        let qp = self.ours.qp();
        let half = written.len() / 2;
        self.sq
            .post_bytes(qp, write(0, half), &written[..half], false)
            .expect("WRITE");
        self.sq
            .post_bytes(qp, write(half, half), &written[half..2 * half], false)
            .expect("WRITE");
        self.sq
            .post_read(qp, at(READ_AT, READ_LEN), READ_LEN)
            .expect("READ");
        let rest = &written[2 * half..];
        let mut batch = self.sq.batch(qp);
        batch
            .push_bytes(write(2 * half, 0), &[], false)
            .expect("batched WRITE");
        batch
            .push_bytes(write(2 * half, rest.len()), rest, true)
            .expect("batched WRITE");
        assert_eq!(batch.post().expect("post the batch"), 2);
    }
}

/// Two send queues on one send CQ, in the same slot of a poller one
/// generation apart, post the same sequence numbers; every completion is
/// handed first to the queue it is not for, which refuses it and retires
/// nothing, then to its own, which retires exactly its requests, oldest
/// first, and hands on its READ's data byte for byte.
#[test]
#[ignore = "needs an RDMA device"]
fn send_queues_sharing_a_cq_retire_only_their_own_requests() {
    let ctx = Context::open(Some(&device())).expect("open the device");
    let pd = ProtectionDomain::new(&ctx).expect("PD");
    let (send_cq, send_poller) = CompletionQueue::new(&ctx, 64).expect("send CQ");
    let (recv_cq, _recv_poller) = CompletionQueue::new(&ctx, 64).expect("receive CQ");
    let queues = Queues {
        send_cq: &send_cq,
        recv_cq: &recv_cq,
        srq: None,
    };
    let mut reaper = Reaper::new(send_poller);
    let mut conns = [
        Pooled::connect(&pd, queues, PooledIds::new(3, 1), 1),
        Pooled::connect(&pd, queues, PooledIds::new(3, 2), 2),
    ];
    let written = [pattern(601, 11), pattern(601, 12)];
    for (conn, data) in conns.iter_mut().zip(&written) {
        conn.post(data);
    }
    let qpns = [conns[0].ours.qp_num(), conns[1].ours.qp_num()];
    let mut refused = 0;
    let mut wait = BoundedWait::new(WAIT, "every request of both queues to retire");
    while conns.iter().any(|c| c.sq.ledger().outstanding() > 0) {
        let reaped = reaper.reap(POLL_BATCH).expect("reap the shared CQ");
        for polled in reaped.each() {
            let wc = polled.wc();
            assert_eq!(wc.status(), WcStatus::SUCCESS, "{wc:?}");
            let own = qpns
                .iter()
                .position(|&q| q == wc.qp_num())
                .expect("a completion of one of the two queue pairs");
            let (index, gen, _) = wr_id::unpack_pooled(wc.wr_id());
            assert_eq!(
                PooledIds::new(index, gen),
                conns[own].names,
                "the wr_id names its connection"
            );
            let other = &mut conns[1 - own].sq;
            let before = (other.ledger().retired(), other.ledger().outstanding());
            let taken = other.retire(polled.alone(), |r| {
                panic!("a queue retired {r:?} for the other queue's completion")
            });
            assert!(
                matches!(taken, Err(Error::ForeignCompletion { .. })),
                "{taken:?}"
            );
            let after = (other.ledger().retired(), other.ledger().outstanding());
            assert_eq!(after, before, "the refusal retired nothing");
            refused += 1;
            let conn = &mut conns[own];
            let (retired, reads) = (&mut conn.retired, &mut conn.reads);
            conn.sq
                .retire(polled.alone(), |r| {
                    retired.push(r.seq);
                    reads.extend(r.read.map(<[u8]>::to_vec));
                })
                .expect("its own queue takes it");
        }
        wait.tick().expect("the completions of both queues");
    }
    assert!(
        refused >= 2,
        "each queue was handed the other's completions"
    );
    for (conn, data) in conns.iter().zip(&written) {
        assert_eq!(conn.retired, (0..5).collect::<Vec<_>>(), "{:?}", conn.names);
        assert_eq!(
            conn.reads,
            [conn.initial[READ_AT..READ_AT + READ_LEN].to_vec()],
            "the READ's data"
        );
        let mut landed = vec![0u8; data.len()];
        conn.region
            .copy_to(0, &mut landed)
            .expect("the peer's region");
        assert_eq!(landed, *data, "the WRITEs landed at the peer");
    }
}
