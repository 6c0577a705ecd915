//! The attacks: each runs to its end and returns one summary line, or an
//! error when the server did not answer as it must.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use pinpoll::connect::cm::Connector;
use pinpoll_apps::filexfer::protocol::{join_hello, FailCode, Msg, HELLO};
use pinpoll_apps::filexfer::{engine_config, CHUNK};

use crate::raw;

/// The server under attack.
pub struct Target {
    pub addr: SocketAddr,
    /// Bound on every wait for the server.
    pub timeout: Duration,
}

/// Connects with `private` and returns the server's rejection reason; a
/// connection that is accepted is an error.
fn rejection(target: &Target, private: &[u8]) -> anyhow::Result<String> {
    let qp = engine_config(target.timeout, false).qp;
    match Connector::resolve(target.addr, &qp)?.connect(private) {
        Err(pinpoll::Error::Rejected { reason }) => Ok(reason.unwrap_or_default()),
        Err(e) => Err(e).context("a connect that should have been rejected"),
        Ok(_) => bail!("the server accepted a connection it must reject"),
    }
}

pub fn bad_hellos(target: &Target, count: usize, threads: usize) -> anyhow::Result<String> {
    let began = Instant::now();
    let threads = threads.clamp(1, count.max(1));
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let share = count / threads + usize::from(t < count % threads);
                s.spawn(move || -> anyhow::Result<()> {
                    for _ in 0..share {
                        let why = rejection(target, &[b'X'; 56])?;
                        ensure!(why.contains("unknown private data"), "rejected as: {why}");
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().map_err(|_| anyhow::anyhow!("a thread panicked"))?)
    })?;
    Ok(format!(
        "bad-hellos: {count} sent, {count} rejected (unknown private data) in {:.1} s",
        began.elapsed().as_secs_f64()
    ))
}

pub fn guessed_tokens(target: &Target, count: usize) -> anyhow::Result<String> {
    for _ in 0..count {
        let token = pinpoll_appkit::random_u64()?;
        let why = rejection(target, &raw::with_descriptor(&join_hello(token, 1)))?;
        ensure!(
            why.contains("no transfer of this server is waiting"),
            "rejected as: {why}"
        );
    }
    Ok(format!(
        "guessed-tokens: {count} sent, {count} rejected (no transfer waits for them)"
    ))
}

/// The `Fail` the server sends on `conn`, which must come.
fn fail_of(conn: &mut pinpoll::Connection) -> anyhow::Result<(FailCode, String)> {
    loop {
        match raw::next_msg(conn)? {
            Msg::Fail { code, message } => return Ok((code, message)),
            Msg::Credit { .. } => continue,
            other => bail!("the server sent {} instead of Fail", other.name()),
        }
    }
}

pub fn stalled_joins(target: &Target, count: usize) -> anyhow::Result<String> {
    let mut said = String::new();
    for k in 0..count {
        let began = Instant::now();
        let mut first = raw::connect(target.addr, target.timeout)?;
        let token = match raw::start(&mut first, &format!("stalled-{k}.bin"), 1 << 20, 2)? {
            Msg::Ready { token, .. } => token,
            other => bail!("the server answered Start with {}", other.name()),
        };
        let private = raw::with_descriptor(&join_hello(token, 1));
        let stalled = raw::half_open(target.addr, target.timeout, &private)?;
        let (code, message) = fail_of(&mut first)?;
        drop(stalled);
        ensure!(
            code == FailCode::Protocol,
            "failed with {code:?}: {message}"
        );
        said = format!("{message} (after {:.1} s)", began.elapsed().as_secs_f64());
    }
    Ok(format!(
        "stalled-joins: {count} transfers ended by the server: {said}"
    ))
}

pub fn half_open(target: &Target, count: usize, hold: Duration) -> anyhow::Result<String> {
    for _ in 0..count {
        let held = raw::half_open(target.addr, target.timeout, &raw::with_descriptor(&HELLO))?;
        std::thread::sleep(hold);
        drop(held);
    }
    Ok(format!(
        "half-open: {count} handshakes left half-open, {} s each",
        hold.as_secs()
    ))
}

pub fn announce(target: &Target, size: u64) -> anyhow::Result<String> {
    let mut conn = raw::connect(target.addr, target.timeout)?;
    match raw::start(&mut conn, "announced.bin", size, 1)? {
        Msg::Fail { code, message } => Ok(format!(
            "announce: {size} bytes refused ({code:?}): {message}"
        )),
        other => bail!(
            "the server answered a Start of {size} bytes with {}",
            other.name()
        ),
    }
}

pub fn trickle(target: &Target, size: u64, rate: u64) -> anyhow::Result<String> {
    ensure!(rate > 0, "--rate must be positive");
    let began = Instant::now();
    let mut conn = raw::connect(target.addr, target.timeout)?;
    let slots = match raw::start(&mut conn, "trickle.bin", size, 1)? {
        Msg::Ready { slots, .. } => slots,
        other => bail!("the server answered Start with {}", other.name()),
    };
    let data: Vec<u8> = (0..size).map(|i| (i * 31 + i / 4099) as u8).collect();
    let pause = Duration::from_secs_f64(CHUNK as f64 / rate as f64);
    match raw::send_slowly(&mut conn, slots, &data, pause)? {
        Msg::Complete { size: stored } if stored == size => Ok(format!(
            "trickle: {size} bytes at {rate} B/s stored in {:.1} s",
            began.elapsed().as_secs_f64()
        )),
        other => bail!("the trickle ended with {other:?}"),
    }
}
