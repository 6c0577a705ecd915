//! An echo server, a program of its own: the out-of-band TCP set-up
//! (each side sends its connection record over a TCP stream the program
//! already has), then one RDMA connection per client, every message sent
//! back until the client says `bye`.
//!
//! ```text
//! echo_server [TCP_ADDRESS] [CLIENTS]     # default 127.0.0.1:0, 1 client
//! ```
//!
//! It prints `listening on ADDRESS` first, so a client (`echo_client`, or
//! a script) knows where to connect. The RDMA device is the first one
//! whose port 1 is active (`PINPOLL_DEVICE` names another).

use std::io::Write;
use std::net::TcpListener;

use pinpoll::{Connection, EngineConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let address = args.next().unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let clients: u32 = match args.next() {
        Some(n) => n
            .parse()
            .map_err(|_| format!("CLIENTS must be a number, not {n:?}"))?,
        None => 1,
    };
    let device = std::env::var("PINPOLL_DEVICE").ok();
    let cfg = EngineConfig::default();

    let tcp = TcpListener::bind(&address)?;
    println!("listening on {}", tcp.local_addr()?);
    std::io::stdout().flush()?;
    for _ in 0..clients {
        let (mut stream, peer) = tcp.accept()?;
        // Both sides run the same exchange; the stream is only for set-up.
        let mut conn = Connection::over_tcp(&mut stream, device.as_deref(), &cfg)?;
        let mut echoed = 0u64;
        loop {
            // recv() waits (bounded by the completion timeout) and lends
            // the bytes until the next call on `conn`: copy what you keep.
            let msg = conn.recv()?.data.to_vec();
            conn.send(&msg)?;
            if msg == b"bye" {
                break;
            }
            echoed += 1;
        }
        // close() delivers what is still queued (the last echo) first.
        conn.close()?;
        println!("{peer}: echoed {echoed} messages");
    }
    Ok(())
}
