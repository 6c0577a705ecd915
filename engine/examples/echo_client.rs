//! The client of `echo_server`, a separate program: connects over TCP,
//! sets the RDMA connection up over that stream, sends messages and checks
//! every echo byte for byte.
//!
//! ```text
//! echo_client SERVER_TCP_ADDRESS
//! echo_client            # starts ./echo_server beside itself, then talks to it
//! ```
//!
//! Built with `cargo build -p pinpoll --examples`; inside the SoftRoCE
//! guest: `scripts/softroce-vm -- target/debug/examples/echo_client`.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use pinpoll::{Connection, EngineConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let device = std::env::var("PINPOLL_DEVICE").ok();
    let (address, server) = match std::env::args().nth(1) {
        Some(address) => (address, None),
        None => {
            let (address, child) = start_server()?;
            (address, Some(child))
        }
    };
    let cfg = EngineConfig::default();
    let mut stream = TcpStream::connect(&address)?;
    let mut conn = Connection::over_tcp(&mut stream, device.as_deref(), &cfg)?;

    for i in 0..100u32 {
        let msg: Vec<u8> = (0..1 + i * 37 % 4000).map(|b| (b ^ i) as u8).collect();
        conn.send(&msg)?;
        let echo = conn.recv()?;
        if echo.data != msg.as_slice() {
            return Err(format!("echo {i} differs from what was sent").into());
        }
    }
    conn.send(b"bye")?;
    if conn.recv()?.data != b"bye" {
        return Err("the server did not say bye".into());
    }
    conn.close()?;
    println!("100 messages echoed byte for byte");

    if let Some(mut server) = server {
        let status = server.wait()?;
        if !status.success() {
            return Err(format!("echo_server ended with {status}").into());
        }
    }
    Ok(())
}

/// Starts the `echo_server` built beside this program and reads the
/// address it listens on.
fn start_server() -> Result<(String, Child), Box<dyn std::error::Error>> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name("echo_server");
    let mut child = Command::new(&path)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| {
            format!(
                "cannot start {} ({e}); build it with `cargo build -p pinpoll --example echo_server`, or give a server's address",
                path.display()
            )
        })?;
    let mut line = String::new();
    let stdout = child.stdout.take().ok_or("no stdout from echo_server")?;
    let mut lines = BufReader::new(stdout);
    lines.read_line(&mut line)?;
    // The rest of what it says is passed on: a closed pipe would end it.
    std::thread::spawn(move || {
        for said in lines.lines().map_while(Result::ok) {
            println!("echo_server: {said}");
        }
    });
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .ok_or_else(|| format!("echo_server said {line:?}, not where it listens"))?
        .to_owned();
    Ok((address, child))
}
