//! Zero heap allocations on the data path, as a measured fact, counted
//! twice: by a counting global allocator (Rust's allocations) and by an
//! LD_PRELOAD interposer (`tests/malloc_count`) that counts every call of
//! the malloc family in the process — Rust's allocator's and every C
//! library's, librdmacm's and libibverbs' included.
//!
//! After a warm-up, each operation kind runs 100 000 times (10 000 for
//! READs waited for one at a time) with both counts unchanged: in direct
//! mode SEND, WRITE, WRITE_WITH_IMM, READ, a mixed batch,
//! `try_write_from`, `Batch::write_region` with its regions reclaimed,
//! `Batch::send_from`, the waiting `read` and `try_recv`; in engine mode SEND, WRITE, WRITE_WITH_IMM, READ, the mixed
//! operations, and READs waited for with `Engine::wait`. Then each mode
//! sits idle for 400 heartbeat intervals while a wait (direct) or the
//! worker (engine) runs its slow path — peer checks and heartbeats, which
//! must be seen to be sent. The peer (a direct-mode connection on another
//! thread of this process) is counted too. Before any of it, the C count
//! must catch an allocation made inside libc, or the test fails: the
//! interposer is live.
//!
//! Runs without the libtest harness, whose own threads allocate (e.g. the
//! "has been running for over 60 seconds" notice) and would be counted,
//! and runs itself again under the interposer. Like a harnessed device
//! test it runs only with `--include-ignored`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pinpoll::alloc::CountingAllocator;
use pinpoll::connect::cm::Listener;
use pinpoll::{
    Access, Connection, Engine, EngineConfig, EngineEvent, Error, Event, MemoryRegion, PageSize,
    QpConfig, Stats,
};
use pinpoll_malloc_count::{is_counted_run, run_counted, CHeap, Calls};
use pinpoll_testkit::cm_addr;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator::new();

const OPS: u64 = 100_000;
/// Operations of a kind that waits out one round trip per operation
/// (`ReadWait`): each still goes round every ring many times, in a tenth
/// of the time a guest needs for OPS of them.
const ROUND_TRIPS: u64 = 10_000;
/// A multiple of [`CELLS`], like [`OPS`] and [`ROUND_TRIPS`].
const WARM_UP: u64 = 2_048;
/// Messages the server consumes before it acknowledges with one SEND: the
/// client never has more in flight than the server has receives posted.
const WINDOW: u64 = 32;
const ACK: [u8; 8] = [0xAC; 8];
/// WRITEs and READs go to these cells of the peer's target ring.
const CELLS: u64 = 32;
const CELL_BYTES: u64 = 1024;
/// What a READ of a cell asks for.
const READ_LEN: usize = 256;

const HEARTBEAT: Duration = Duration::from_millis(5);
/// The measured idle stretch, and the one that warms the idle path up.
const IDLE: Duration = Duration::from_millis(5 * 400);
const IDLE_WARM_UP: Duration = Duration::from_millis(5 * 20);
/// A heartbeat, its completion, and the next one: the cycle ran.
const MIN_HEARTBEATS: u64 = 2;
/// How long the client spins on `try_recv` for an acknowledgement.
const ACK_WAIT: Duration = Duration::from_secs(30);

/// The SENDs the server checks: every byte alike, 48 (inline) or 600
/// (through the send ring) of them.
static SMALL: [u8; 48] = [1; 48];
static LARGE: [u8; 600] = [2; 600];
/// The byte of every `Batch::send_from` payload.
const SEND_FROM_BYTE: u8 = 3;
/// An idle request: these four bytes, then the stretch in milliseconds
/// (u32, little-endian). The server acknowledges once it has passed.
const IDLE_REQUEST: [u8; 4] = [0x1D; 4];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Write,
    WriteImm,
    Read,
    Mixed,
    WriteFrom,
    WriteRegion,
    SendFrom,
    ReadWait,
    TryRecv,
}

/// Registered regions `WriteRegion` lends, in turn.
const REGIONS: usize = 8;

const DIRECT_KINDS: [Kind; 10] = [
    Kind::Send,
    Kind::Write,
    Kind::WriteImm,
    Kind::Read,
    Kind::Mixed,
    Kind::WriteFrom,
    Kind::WriteRegion,
    Kind::SendFrom,
    Kind::ReadWait,
    Kind::TryRecv,
];

/// What engine mode offers: SEND, WRITE and READ, which its worker posts
/// alone or in batches; `ReadWait` waits with `Engine::wait`.
const ENGINE_KINDS: [Kind; 6] = [
    Kind::Send,
    Kind::Write,
    Kind::WriteImm,
    Kind::Read,
    Kind::Mixed,
    Kind::ReadWait,
];

fn config() -> EngineConfig {
    let mut built = EngineConfig::default();
    built.qp = QpConfig::default();
    built.qp.max_send_wr = 128;
    built.qp.max_recv_wr = 128;
    built.qp.cq_depth = 256;
    built.qp.max_inline_data = 64;
    built.qp.timeout = 14;
    built.qp.retry_count = 7;
    built.qp.rnr_retry = 6;
    built.qp.connect_timeout = Duration::from_secs(10);
    built.batch_size = 16;
    built.signal_interval = 16;
    built.inline_threshold = 64;
    built.slot_size = 1024;
    built.slot_count = 64;
    built.handoff_depth = 256;
    built.completion_timeout = Duration::from_secs(30);
    built.heartbeat_interval = Some(HEARTBEAT);
    // A heartbeat may wait 5 s for its answer in a busy guest.
    built.heartbeat_misses = 1000;
    built
}

fn payload(i: u64) -> &'static [u8] {
    if i.is_multiple_of(2) {
        &SMALL
    } else {
        &LARGE
    }
}

/// The remote offset of operation `i`'s cell.
fn cell(i: u64) -> u64 {
    (i % CELLS) * CELL_BYTES
}

/// What `try_write_from` fills operation `i`'s payload with.
fn fill_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// The pattern `ReadWait` gives cell `i % CELLS` before reading it.
fn cell_byte(i: u64) -> u8 {
    0x40 + (i % CELLS) as u8
}

fn uniform(data: &[u8], byte: u8) -> bool {
    data.iter().all(|&b| b == byte)
}

fn idle_request(stretch: Duration) -> [u8; 8] {
    let mut request = [0u8; 8];
    request[..4].copy_from_slice(&IDLE_REQUEST);
    request[4..].copy_from_slice(&(stretch.as_millis() as u32).to_le_bytes());
    request
}

fn idle_requested(data: &[u8]) -> Option<Duration> {
    let ms: [u8; 4] = data.strip_prefix(&IDLE_REQUEST)?.try_into().ok()?;
    Some(Duration::from_millis(u32::from_le_bytes(ms).into()))
}

fn measured_ops(kind: Kind) -> u64 {
    match kind {
        Kind::ReadWait => ROUND_TRIPS,
        _ => OPS,
    }
}

/// SENDs and immediates of `kind` the server consumes (each acknowledged).
fn consumed_by(kind: Kind, n: u64) -> u64 {
    match kind {
        Kind::Send | Kind::WriteImm | Kind::SendFrom | Kind::TryRecv => n / WINDOW * WINDOW,
        Kind::Mixed => n / 4 * 2,
        _ => 0,
    }
}

/// The peer: consumes SENDs (checking each) and immediates, acknowledging
/// every WINDOW, and acknowledges an idle request once its stretch passed.
fn serve(mut conn: Connection, stop: Arc<AtomicBool>, consumed: Arc<AtomicU64>) {
    let mut since_ack = 0u64;
    let mut idle_until = None;
    while !stop.load(Ordering::Relaxed) {
        let mut got = 0u64;
        let mut idle_for = None;
        conn.poll(|ev| match ev {
            Event::Received { data } => match idle_requested(data) {
                Some(stretch) => idle_for = Some(stretch),
                None => {
                    assert!(
                        matches!(data.len(), 48 | 600) && uniform(data, data[0]),
                        "server: a garbled message of {} bytes",
                        data.len()
                    );
                    got += 1;
                }
            },
            Event::WriteImm { .. } => got += 1,
            Event::Failed(e) => panic!("server: {e}"),
            _ => {}
        })
        .unwrap();
        if let Some(stretch) = idle_for {
            idle_until = Some(Instant::now() + stretch);
        }
        if idle_until.is_some_and(|t| Instant::now() >= t) {
            idle_until = None;
            conn.send(&ACK).unwrap();
        }
        if got > 0 {
            consumed.fetch_add(got, Ordering::Relaxed);
            since_ack += got;
            while since_ack >= WINDOW {
                since_ack -= WINDOW;
                conn.send(&ACK).unwrap();
            }
        }
    }
}

fn wait_ack(client: &mut Connection) {
    let got = client.recv().unwrap();
    assert_eq!(got.data, ACK);
}

fn direct(client: &mut Connection, regions: &mut Vec<MemoryRegion>, kind: Kind, n: u64) {
    match kind {
        Kind::Send | Kind::WriteImm => windows(client, kind, n),
        Kind::Write => {
            for i in 0..n {
                client.write(payload(i), cell(i), None).unwrap();
            }
        }
        Kind::Read => batched_reads(client, n),
        Kind::Mixed => mixed_batches(client, n),
        Kind::WriteFrom => writes_from_slots(client, n),
        Kind::WriteRegion => writes_from_regions(client, regions, n),
        Kind::SendFrom => sends_from_slots(client, n),
        Kind::ReadWait => waiting_reads(client, n),
        Kind::TryRecv => try_recv_windows(client, n),
    }
    client
        .wait_idle(|ev| assert!(!matches!(ev, Event::Failed(_)), "{ev:?}"))
        .unwrap();
}

/// SENDs or WRITE_WITH_IMMs, WINDOW per acknowledgement (waited for by `recv`).
fn windows(client: &mut Connection, kind: Kind, n: u64) {
    for w in 0..n / WINDOW {
        for i in 0..WINDOW {
            if kind == Kind::Send {
                client.send(payload(i)).unwrap();
            } else {
                let imm = (w * WINDOW + i) as u32;
                client.write(payload(i), cell(i), Some(imm)).unwrap();
            }
        }
        wait_ack(client);
    }
}

/// READs eight to a batch, their data taken from `poll`.
fn batched_reads(client: &mut Connection, n: u64) {
    for i in 0..n / 8 {
        let mut batch = client.batch();
        for j in 0..8 {
            batch.read(cell(i + j), READ_LEN).unwrap();
        }
        batch.post().unwrap();
        let mut done = 0;
        while done < 8 {
            client
                .poll(|ev| match ev {
                    Event::ReadCompleted { data, .. } => {
                        assert_eq!(data.len(), READ_LEN);
                        done += 1;
                    }
                    Event::Failed(e) => panic!("{e}"),
                    _ => {}
                })
                .unwrap();
        }
    }
}

/// Each round: SEND, WRITE, WRITE_WITH_IMM and READ in one batch.
fn mixed_batches(client: &mut Connection, n: u64) {
    let mut consumed = 0;
    for round in 0..n / 4 {
        while client.outstanding() + 4 > 128 - 16 {
            client.reap().unwrap();
        }
        let mut batch = client.batch();
        batch.send(payload(round)).unwrap();
        batch.write(payload(round + 1), 0, None).unwrap();
        batch
            .write(payload(round), 2048, Some(round as u32))
            .unwrap();
        batch.read(4096, 128).unwrap();
        batch.post().unwrap();
        consumed += 2;
        if consumed == WINDOW {
            consumed = 0;
            wait_ack(client);
        }
    }
}

/// `try_write_from`, each payload filled in its send-ring slot; then the
/// last fill of every cell is read back with the waiting `read`.
fn writes_from_slots(client: &mut Connection, n: u64) {
    for i in 0..n {
        let byte = fill_byte(i);
        let fill = |slot: &mut [u8]| {
            slot.fill(byte);
            Ok(())
        };
        loop {
            match client.try_write_from(payload(i).len(), cell(i), None, fill) {
                Ok(_) => break,
                Err(Error::Full { what, .. }) => {
                    assert!(
                        client.outstanding() > 0,
                        "{what} full with nothing in flight"
                    );
                    client.reap().unwrap();
                }
                Err(e) => panic!("try_write_from {i}: {e}"),
            }
        }
    }
    for i in n - CELLS..n {
        read_cell(client, i, payload(i).len(), fill_byte(i));
    }
}

/// `Batch::write_region` from `regions` in turn, each filled while it is
/// this side's and reclaimed once its WRITE retired; then the last write
/// of every cell is read back with the waiting `read`.
fn writes_from_regions(client: &mut Connection, regions: &mut Vec<MemoryRegion>, n: u64) {
    let mut i = 0;
    while i < n {
        while let Some(region) = client.reclaim() {
            regions.push(region);
        }
        let Some(mut region) = regions.pop() else {
            client.reap().unwrap();
            continue;
        };
        let len = payload(i).len();
        region.as_mut_slice()[..len].fill(fill_byte(i));
        let mut b = client.batch();
        if regions.is_empty() {
            // The last free region: its WRITE's completion retires the
            // others, so they can come back.
            b.signal_next();
        }
        match b.write_region(region, len, cell(i), None) {
            Ok(_) => {
                b.post().unwrap();
                i += 1;
            }
            Err(refused) => {
                drop(b);
                assert!(
                    matches!(refused.error, Error::Full { .. }) && client.outstanding() > 0,
                    "write_region {i}: {}",
                    refused.error
                );
                regions.push(refused.region);
                client.reap().unwrap();
            }
        }
    }
    client
        .wait_idle(|ev| assert!(!matches!(ev, Event::Failed(_)), "{ev:?}"))
        .unwrap();
    while let Some(region) = client.reclaim() {
        regions.push(region);
    }
    assert_eq!(regions.len(), REGIONS, "every lent region came back");
    for i in n - CELLS..n {
        read_cell(client, i, payload(i).len(), fill_byte(i));
    }
}

/// The waiting `read` of operation `i`'s cell, which must hold `len`
/// bytes of `byte`.
fn read_cell(client: &mut Connection, i: u64, len: usize, byte: u8) {
    let data = client.read(cell(i), len).unwrap();
    assert!(
        data.len() == len && uniform(data, byte),
        "cell {} read by operation {i}",
        i % CELLS
    );
}

/// `Batch::send_from`, eight to a batch, WINDOW per acknowledgement.
fn sends_from_slots(client: &mut Connection, n: u64) {
    for _ in 0..n / WINDOW {
        let mut sent = 0u64;
        while sent < WINDOW {
            let mut batch = client.batch();
            let mut full = false;
            while sent < WINDOW && batch.len() < 8 {
                let fill = |slot: &mut [u8]| {
                    slot.fill(SEND_FROM_BYTE);
                    Ok(())
                };
                match batch.send_from(payload(sent).len(), fill) {
                    Ok(_) => sent += 1,
                    Err(Error::Full { .. } | Error::BatchFull { .. }) => {
                        full = true;
                        break;
                    }
                    Err(e) => panic!("send_from: {e}"),
                }
            }
            batch.post().unwrap();
            if full {
                client.reap().unwrap();
            }
        }
        wait_ack(client);
    }
}

/// The waiting `read`: every cell first gets its pattern, then each READ
/// must return it.
fn waiting_reads(client: &mut Connection, n: u64) {
    let mut pattern = [0u8; READ_LEN];
    for c in 0..CELLS {
        pattern.fill(cell_byte(c));
        client.write(&pattern, cell(c), None).unwrap();
    }
    for i in 0..n {
        read_cell(client, i, READ_LEN, cell_byte(i));
    }
}

/// SENDs, WINDOW per acknowledgement, which `try_recv` spins for.
fn try_recv_windows(client: &mut Connection, n: u64) {
    for _ in 0..n / WINDOW {
        for i in 0..WINDOW {
            client.send(payload(i)).unwrap();
        }
        let deadline = Instant::now() + ACK_WAIT;
        loop {
            if let Some(got) = client.try_recv().unwrap() {
                assert_eq!(got.data, ACK);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no acknowledgement in {ACK_WAIT:?}"
            );
        }
    }
}

/// Waits (`recv`) for an acknowledgement the peer sends only after
/// `stretch`, while the wait's slow path checks the peer and sends
/// heartbeats. Returns the heartbeats: all the client posted meanwhile.
fn direct_idle(client: &mut Connection, stretch: Duration) -> u64 {
    client.send(&idle_request(stretch)).unwrap();
    let posted = client.stats().posted;
    wait_ack(client);
    client.stats().posted - posted
}

/// Engine-mode bookkeeping: acknowledgements and READs that came back.
#[derive(Debug, Default)]
struct Tally {
    acks: u64,
    reads: u64,
}

impl Tally {
    fn take(&mut self, ev: EngineEvent<'_>) {
        match ev {
            EngineEvent::Received { data } => {
                assert_eq!(data, ACK);
                self.acks += 1;
            }
            EngineEvent::ReadCompleted { data, .. } => {
                assert_eq!(data.len(), READ_LEN);
                self.reads += 1;
            }
            EngineEvent::Failed(err) => panic!("{err}"),
            EngineEvent::Refused { id } => panic!("op {id} refused"),
            _ => {}
        }
    }

    fn drain(&mut self, e: &mut Engine) {
        while let Some(ev) = e.poll() {
            self.take(ev);
        }
    }

    /// Submits with `f`, draining completions while the engine pushes
    /// back; returns the operation's id.
    fn submit(
        &mut self,
        e: &mut Engine,
        mut f: impl FnMut(&mut Engine) -> pinpoll::Result<u64>,
    ) -> u64 {
        loop {
            match f(e) {
                Ok(id) => return id,
                Err(Error::Full { .. }) => self.drain(e),
                Err(err) => panic!("{err}"),
            }
        }
    }
}

fn engine(e: &mut Engine, kind: Kind, n: u64) {
    if kind == Kind::ReadWait {
        return engine_waiting_reads(e, n);
    }
    let mut tally = Tally::default();
    let (mut consuming, mut reads_posted) = (0u64, 0u64);
    for i in 0..n {
        let op = match kind {
            Kind::Mixed => [Kind::Send, Kind::Write, Kind::WriteImm, Kind::Read][(i % 4) as usize],
            k => k,
        };
        // Never more un-acknowledged messages than the server has receives.
        if matches!(op, Kind::Send | Kind::WriteImm) {
            while consuming >= (tally.acks + 2) * WINDOW {
                tally.drain(e);
            }
            consuming += 1;
        }
        let data = payload(i);
        match op {
            Kind::Send => tally.submit(e, |e| e.try_send(data)),
            Kind::Write => tally.submit(e, |e| e.try_write(data, cell(i), None)),
            Kind::WriteImm => tally.submit(e, |e| e.try_write(data, cell(i), Some(i as u32))),
            Kind::Read => {
                reads_posted += 1;
                tally.submit(e, |e| e.try_read(cell(i), READ_LEN))
            }
            other => unreachable!("{other:?} is not an engine-mode operation"),
        };
    }
    while tally.acks < consuming / WINDOW || tally.reads < reads_posted {
        tally.drain(e);
    }
}

/// READs one at a time, each waited for with `Engine::wait` and checked
/// against the pattern its cell was given first.
fn engine_waiting_reads(e: &mut Engine, n: u64) {
    let mut tally = Tally::default();
    let mut pattern = [0u8; READ_LEN];
    let mut last = 0;
    for c in 0..CELLS {
        pattern.fill(cell_byte(c));
        if c + 1 == CELLS {
            e.signal_next();
        }
        last = tally.submit(e, |e| e.try_write(&pattern, cell(c), None));
    }
    loop {
        match e.wait().unwrap() {
            EngineEvent::Completed { id, .. } if id == last => break,
            ev => tally.take(ev),
        }
    }
    for i in 0..n {
        let id = tally.submit(e, |e| e.try_read(cell(i), READ_LEN));
        loop {
            match e.wait().unwrap() {
                EngineEvent::ReadCompleted { id: done, data } if done == id => {
                    assert!(
                        data.len() == READ_LEN && uniform(data, cell_byte(i)),
                        "read {i} returned cell {}'s pattern",
                        i % CELLS
                    );
                    break;
                }
                ev => tally.take(ev),
            }
        }
    }
}

/// The application of an idle engine: polls now and then, finds nothing.
fn sit_idle(e: &mut Engine, stretch: Duration) {
    let start = Instant::now();
    while start.elapsed() < stretch {
        if let Some(ev) = e.poll() {
            panic!("an idle engine reported {ev:?}");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

type Pair = (
    Connection,
    std::thread::JoinHandle<()>,
    Arc<AtomicBool>,
    Arc<AtomicU64>,
);

fn pair(cfg: &EngineConfig) -> Pair {
    let listener = Listener::bind(cm_addr()).unwrap();
    let addr = listener.local_addr().unwrap();
    let (scfg, stop, consumed) = (
        cfg.clone(),
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let (s2, c2) = (Arc::clone(&stop), Arc::clone(&consumed));
    let server = std::thread::spawn(move || {
        let conn = Connection::accept(&listener, &scfg, Duration::from_secs(10)).unwrap();
        serve(conn, s2, c2)
    });
    (
        Connection::connect(addr, cfg).unwrap(),
        server,
        stop,
        consumed,
    )
}

/// Allocations over one measured region: Rust's, and the C heap's — every
/// malloc-family call, Rust's allocator's included — and how long it took
/// (printed only: guests are slow).
#[derive(Debug, Clone, Copy)]
struct Allocations {
    rust: u64,
    c: Calls,
    took: Duration,
}

/// Reads both counters around a region.
struct Meter {
    c_heap: CHeap,
}

impl Meter {
    fn now(&self) -> (u64, Calls) {
        let rust = ALLOCATOR.allocations();
        let c = self.c_heap.read().expect("reading the C heap counters");
        (rust, c)
    }

    fn measure(&self, work: impl FnOnce()) -> Allocations {
        let (rust, c) = self.now();
        let start = Instant::now();
        work();
        let took = start.elapsed();
        let (rust_after, c_after) = self.now();
        Allocations {
            rust: rust_after - rust,
            c: c_after.since(&c),
            took,
        }
    }
}

/// The measured regions, each printed as it is recorded.
#[derive(Default)]
struct Report {
    rows: Vec<(String, Allocations)>,
}

impl Report {
    fn record(&mut self, what: String, a: Allocations) {
        println!(
            "{what:<50} {:>7.1} s   Rust allocator {:>2}   C heap {}",
            a.took.as_secs_f64(),
            a.rust,
            a.c
        );
        self.rows.push((what, a));
    }

    fn allocating(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|(_, a)| a.rust != 0 || a.c.total() != 0)
            .map(|(what, a)| format!("{what}: Rust allocator {}, C heap {}", a.rust, a.c))
            .collect()
    }
}

/// The C count must see what only C allocates — realpath(3), which
/// `std::fs::canonicalize` calls, mallocs its result inside libc — or the
/// interposer is not counting and every zero below would prove nothing.
fn c_allocations_are_counted(meter: &Meter) {
    let a = meter.measure(|| {
        std::hint::black_box(std::fs::canonicalize(".").expect("canonicalize ."));
    });
    println!(
        "interposer check: std::fs::canonicalize: Rust allocator {}, C heap {}",
        a.rust, a.c
    );
    assert!(
        a.c.total() > a.rust,
        "the C heap count saw no allocation beyond Rust's (Rust {}, C {}): the interposer \
         ({}) is not counting",
        a.rust,
        a.c,
        pinpoll_malloc_count::INTERPOSER
    );
}

fn direct_mode(cfg: &EngineConfig, meter: &Meter, report: &mut Report) {
    let (mut client, server, stop, consumed) = pair(cfg);
    let mut regions = Vec::with_capacity(REGIONS);
    for _ in 0..REGIONS {
        let region = client
            .endpoint()
            .register(CELL_BYTES as usize, PageSize::Base, Access::LOCAL_READ)
            .unwrap();
        regions.push(region);
    }
    for kind in DIRECT_KINDS {
        direct(&mut client, &mut regions, kind, WARM_UP);
    }
    direct_idle(&mut client, IDLE_WARM_UP);
    for kind in DIRECT_KINDS {
        let n = measured_ops(kind);
        let a = meter.measure(|| direct(&mut client, &mut regions, kind, n));
        report.record(format!("direct {kind:?}: {n} operations"), a);
    }
    let mut heartbeats = 0;
    let a = meter.measure(|| heartbeats = direct_idle(&mut client, IDLE));
    report.record(
        format!("direct idle {IDLE:?} in recv: {heartbeats} heartbeats"),
        a,
    );
    assert!(
        heartbeats >= MIN_HEARTBEATS,
        "the idle wait sent {heartbeats} heartbeats"
    );
    let stats = client.stats();
    assert_eq!((stats.failed, stats.flushed), (0, 0), "{stats:?}");
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    let expected: u64 = DIRECT_KINDS
        .iter()
        .map(|&k| consumed_by(k, WARM_UP) + consumed_by(k, measured_ops(k)))
        .sum();
    assert_eq!(
        consumed.load(Ordering::Relaxed),
        expected,
        "the server consumed every message"
    );
}

fn engine_mode(cfg: &EngineConfig, meter: &Meter, report: &mut Report) {
    // The worker and this thread, both counted.
    let (client, server, stop, _) = pair(cfg);
    let mut e = Engine::spawn(client, cfg).unwrap();
    for kind in ENGINE_KINDS {
        engine(&mut e, kind, WARM_UP);
    }
    for kind in ENGINE_KINDS {
        let n = measured_ops(kind);
        let a = meter.measure(|| engine(&mut e, kind, n));
        report.record(format!("engine {kind:?}: {n} operations"), a);
    }
    let stats = e.shutdown().unwrap().stats;
    assert_eq!((stats.failed, stats.flushed), (0, 0), "{stats:?}");
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();

    let (a, stats) = engine_idle(cfg, meter);
    report.record(
        format!(
            "engine idle {IDLE:?}, worker alone: {} heartbeats",
            stats.posted
        ),
        a,
    );
    assert!(
        stats.posted >= MIN_HEARTBEATS,
        "the idle worker sent {} heartbeats",
        stats.posted
    );
    assert_eq!(
        (stats.completed, stats.failed),
        (stats.posted, 0),
        "every heartbeat was answered: {stats:?}"
    );
}

/// An engine whose application submits nothing: only the worker's slow
/// path runs — peer checks and heartbeats, which are all it posts.
fn engine_idle(cfg: &EngineConfig, meter: &Meter) -> (Allocations, Stats) {
    let (client, server, stop, _) = pair(cfg);
    let mut e = Engine::spawn(client, cfg).unwrap();
    sit_idle(&mut e, IDLE_WARM_UP);
    let a = meter.measure(|| sit_idle(&mut e, IDLE));
    let report = e.shutdown().unwrap();
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    (a, report.stats)
}

const NAME: &str = "the_data_path_never_allocates";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if !args
        .iter()
        .any(|a| a == "--include-ignored" || a == "--ignored")
    {
        println!("test {NAME} ... ignored, needs an RDMA device");
        println!("\ntest result: ok. 0 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out");
        return;
    }
    if !is_counted_run() {
        // The interposer must be loaded when the process starts.
        let status = run_counted().unwrap_or_else(|e| {
            panic!("cannot run {NAME} again under the malloc-counting interposer: {e}")
        });
        if status.code().is_none() {
            eprintln!("{NAME}: the counted run ended by {status}");
        }
        std::process::exit(status.code().unwrap_or(101));
    }
    println!("running 1 test");
    the_data_path_never_allocates();
    println!("test {NAME} ... ok");
    println!("\ntest result: ok. 1 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
}

fn the_data_path_never_allocates() {
    let meter = Meter {
        c_heap: CHeap::attach().unwrap_or_else(|e| panic!("{e}")),
    };
    c_allocations_are_counted(&meter);
    let cfg = config();
    let mut report = Report::default();
    direct_mode(&cfg, &meter, &mut report);
    engine_mode(&cfg, &meter, &mut report);
    let allocating = report.allocating();
    assert!(
        allocating.is_empty(),
        "the data path allocated:\n{}",
        allocating.join("\n")
    );
}
