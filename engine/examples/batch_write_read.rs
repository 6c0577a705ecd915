//! RDMA WRITE and READ in batches — one doorbell for up to `batch_size`
//! requests — and the loop every program needs when a queue is full.
//!
//! The client fills the server's target ring four times over (1 024
//! WRITEs of 4 KiB through a send queue of 256: it fills), READs the ring
//! back in batches and checks every byte; the server checks its own copy
//! of the ring. One process, both sides over loopback TCP for the set-up;
//! the RDMA device is the first whose port 1 is active (`PINPOLL_DEVICE`
//! names another).
//!
//! ```text
//! scripts/softroce-vm -- cargo run -p pinpoll --example batch_write_read
//! ```

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use pinpoll::{Connection, EngineConfig, ErrorKind, Event};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

const ROUNDS: usize = 4;

fn main() -> Res<()> {
    let cfg = EngineConfig::default();
    let device = std::env::var("PINPOLL_DEVICE").ok();
    let tcp = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    let addr = tcp.local_addr()?;
    let (server_cfg, server_device) = (cfg.clone(), device.clone());
    let server = std::thread::spawn(move || -> Res<Vec<u8>> {
        let (mut stream, _) = tcp.accept()?;
        let mut conn = Connection::over_tcp(&mut stream, server_device.as_deref(), &server_cfg)?;
        // The client's WRITEs and READs need nothing of this side's CPU:
        // wait for its word that it is done, then look at the ring.
        loop {
            match conn.recv() {
                Ok(_) => break,
                Err(e) if e.kind() == ErrorKind::Timeout => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let mut ring = vec![0u8; conn.target().len()];
        conn.target().copy_to(0, &mut ring)?;
        conn.close()?;
        Ok(ring)
    });

    let mut stream = TcpStream::connect(addr)?;
    let mut conn = Connection::over_tcp(&mut stream, device.as_deref(), &cfg)?;
    let slot = cfg.slot_size as usize;
    let slots = conn.peer_ring().len as usize / slot;
    let chunk = |round: usize, i: usize| -> Vec<u8> {
        (0..slot).map(|b| (b + 31 * i + 7 * round) as u8).collect()
    };
    let chunks: Vec<(usize, Vec<u8>)> = (0..ROUNDS)
        .flat_map(|round| (0..slots).map(move |i| (round, i)))
        .map(|(round, i)| (i, chunk(round, i)))
        .collect();

    write_all(&mut conn, &chunks)?;
    let read = read_all(&mut conn, slots, slot)?;
    let expected: Vec<u8> = (0..slots).flat_map(|i| chunk(ROUNDS - 1, i)).collect();
    if read != expected {
        return Err("the READs did not return what the last round wrote".into());
    }

    // One more on its own: the retry loop of a single post.
    let last = chunk(ROUNDS, 0);
    loop {
        match conn.try_write(&last, 0, None) {
            Ok(_) => break,
            // Nothing was posted: take completions, then the same call again.
            Err(e) if e.is_retryable() => {
                conn.reap()?;
            }
            Err(e) => return Err(e.into()),
        }
    }
    conn.send(b"done")?;
    conn.close()?;
    let mut expected = expected;
    expected[..slot].copy_from_slice(&last);
    if server.join().map_err(|_| "the server thread panicked")?? != expected {
        return Err("the server's ring does not hold what was written".into());
    }
    println!(
        "{} WRITEs and {slots} READs in batches of {}, every byte checked on both sides",
        chunks.len() + 1,
        cfg.batch_size
    );
    Ok(())
}

/// Posts every chunk as a WRITE to its slot, a batch at a time.
fn write_all(conn: &mut Connection, chunks: &[(usize, Vec<u8>)]) -> Res<()> {
    let mut next = 0;
    while next < chunks.len() {
        let mut batch = conn.batch();
        while let Some((i, data)) = chunks.get(next) {
            match batch.write(data, (i * data.len()) as u64, None) {
                Ok(_) => next += 1,
                // The batch is full, or a queue filled while the batch held
                // the connection: post what it has, then make room.
                Err(e) if e.kind() == ErrorKind::BatchFull => break,
                Err(e) => return Err(e.into()),
            }
        }
        batch.post()?;
        // Retire what completed: frees send-queue entries for the next batch.
        conn.reap()?;
    }
    // Every WRITE acknowledged by the peer's NIC, so placed in its memory.
    conn.wait_idle(|_| {})?;
    Ok(())
}

/// READs the peer's ring back, slot by slot, a batch at a time.
fn read_all(conn: &mut Connection, slots: usize, slot: usize) -> Res<Vec<u8>> {
    let mut ring = vec![0u8; slots * slot];
    let deadline = Instant::now() + Duration::from_secs(60);
    // Which slot each READ (by sequence number) asked for.
    let mut asked = std::collections::HashMap::new();
    let (mut next, mut landed) = (0, 0);
    while landed < slots {
        let mut batch = conn.batch();
        while next < slots {
            match batch.read((next * slot) as u64, slot) {
                Ok(seq) => {
                    asked.insert(seq, next);
                    next += 1;
                }
                Err(e) if e.kind() == ErrorKind::BatchFull => break,
                Err(e) => return Err(e.into()),
            }
        }
        batch.post()?;
        // The data are lent to the callback: copy what you keep. A READ
        // that fails (or flushes after a failure) never lands: stop, with
        // the first reason (a failure comes before the flushes it causes).
        let mut lost: Option<String> = None;
        conn.poll(|ev| match ev {
            Event::ReadCompleted { seq, data } => {
                if let Some(i) = asked.remove(&seq) {
                    ring[i * slot..(i + 1) * slot].copy_from_slice(data);
                    landed += 1;
                }
            }
            Event::Failed(e) => {
                lost.get_or_insert_with(|| e.to_string());
            }
            Event::Flushed { seq, .. } => {
                lost.get_or_insert_with(|| format!("READ {seq} flushed"));
            }
            _ => {}
        })?;
        if let Some(why) = lost {
            return Err(why.into());
        }
        if Instant::now() > deadline {
            return Err(format!("only {landed} of {slots} READs landed in time").into());
        }
    }
    Ok(ring)
}
