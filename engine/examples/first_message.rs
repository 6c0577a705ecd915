//! Your first message with pinpoll, in both modes, over rdma_cm.
//!
//! Runs a server thread and a client in one process on the RDMA device that
//! owns ADDRESS (an IP of the RDMA netdev; on rxe not 127.0.0.1):
//!
//! ```text
//! scripts/softroce-vm -- cargo run -p pinpoll --example first_message
//! cargo run -p pinpoll --example first_message -- 192.168.1.5   # on hardware
//! ```

use std::time::Duration;

use pinpoll::connect::cm::Listener;
use pinpoll::connect::parse_socket_addr;
use pinpoll::{Connection, Engine, EngineConfig, EngineEvent};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let host = std::env::args().nth(1).or_else(|| std::env::var("PINPOLL_ADDR4").ok()).ok_or(
        "usage: first_message ADDRESS (an IP address of the RDMA netdev; scripts/softroce-vm sets PINPOLL_ADDR4)",
    )?;
    let cfg = EngineConfig::default();

    // The server: accept two clients, print one message from each, reply.
    let listener = Listener::bind(parse_socket_addr(&host, 0)?)?;
    let addr = listener.local_addr().ok_or("listener has no address")?;
    let server_cfg = cfg.clone();
    let server = std::thread::spawn(move || -> pinpoll::Result<()> {
        for _ in 0..2 {
            let mut conn = Connection::accept(&listener, &server_cfg, Duration::from_secs(10))?;
            let msg = conn.recv()?;
            println!("server got: {}", String::from_utf8_lossy(msg.data));
            conn.send(b"hello back")?;
            conn.wait_idle(|_| {})?;
        }
        Ok(())
    });

    // Direct mode: this thread posts and polls.
    let mut conn = Connection::connect(addr, &cfg)?;
    conn.send(b"hello from direct mode")?;
    println!("client got: {}", String::from_utf8_lossy(conn.recv()?.data));

    // Engine mode: a worker thread (pinned with cfg.core = Some(n)) owns
    // the connection; this thread hands it work and takes completions.
    let mut engine = Engine::spawn(Connection::connect(addr, &cfg)?, &cfg)?;
    engine.try_send(b"hello from engine mode")?;
    loop {
        if let EngineEvent::Received { data } = engine.wait()? {
            println!("client got: {}", String::from_utf8_lossy(data));
            break;
        }
    }
    engine.shutdown()?;
    server.join().map_err(|_| "server thread panicked")??;
    Ok(())
}
