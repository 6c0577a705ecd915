//! Flags both programs share, and the parsers behind them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

/// The longest message either program sends, and the size of the buffers
/// that receive one: one page.
pub const MAX_MESSAGE: usize = 4096;

/// Flags every subcommand takes, before or after the subcommand's name.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// RDMA device the connection must use, e.g. rxe0 (see `ibv_devices`).
    /// rdma_cm picks the device from the address; with this flag a
    /// connection that lands on any other device is refused.
    #[arg(short = 'd', long, value_name = "NAME", global = true)]
    pub device: Option<String>,

    /// Bound in seconds (fractions allowed) on address and route resolution,
    /// on connection set-up and on every completion wait.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value = "10",
        value_parser = parse_timeout,
        global = true
    )]
    pub timeout: Duration,

    /// Print only the received data: no progress lines on stdout, and only
    /// errors in the log (RUST_LOG overrides the log level).
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

/// Flags of the `server` subcommands.
#[derive(Debug, Clone, Args)]
pub struct ServerArgs {
    /// Local address to listen on. The default `::` listens on every RDMA
    /// device, for IPv6 and IPv4 clients alike (unless the sysctl
    /// net.ipv6.bindv6only is 1); give a device's address to listen on that
    /// device only.
    #[arg(long, value_name = "ADDR", default_value = "::")]
    pub bind: String,

    /// Exit after serving this many clients (successfully or not); exit
    /// status 0 only if every one succeeded. Without it the server runs
    /// until SIGINT or SIGTERM.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
}

/// A `--timeout` value: a positive, finite number of seconds.
pub fn parse_timeout(text: &str) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if secs.is_nan() || secs <= 0.0 {
        return Err(format!("{text:?} must be more than 0 seconds"));
    }
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| *d <= Duration::from_secs(24 * 3600))
        .ok_or_else(|| format!("{text:?} is more than a day"))
}

/// A message to send: 1 to [`MAX_MESSAGE`] bytes of UTF-8.
pub fn parse_message(text: &str) -> Result<String, String> {
    match text.len() {
        0 => Err("the message is empty".into()),
        n if n > MAX_MESSAGE => Err(format!(
            "the message is {n} bytes; at most {MAX_MESSAGE} fit the peer's buffer"
        )),
        _ => Ok(text.to_owned()),
    }
}

/// `host` (an IP literal; IPv6 link-local with `%interface`) and `port`.
pub fn socket_addr(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    pinpoll::connect::parse_socket_addr(host, port).context("invalid address")
}

/// How an address is shown: IPv4-mapped IPv6 addresses (an IPv4 client of a
/// server listening on `::`) as the IPv4 address they are.
pub fn show_addr(addr: Option<SocketAddr>) -> String {
    match addr {
        Some(SocketAddr::V6(v6)) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::from((v4, v6.port())).to_string(),
            None => v6.to_string(),
        },
        Some(addr) => addr.to_string(),
        None => "an unknown address".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_are_positive_finite_seconds() {
        assert_eq!(parse_timeout("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_timeout("0.25"), Ok(Duration::from_millis(250)));
        for bad in ["0", "-1", "nan", "inf", "ten", "", "1e9"] {
            assert!(parse_timeout(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn messages_must_fit_a_receive_buffer() {
        assert_eq!(parse_message("hi"), Ok("hi".to_owned()));
        assert!(parse_message("").is_err());
        assert!(parse_message(&"x".repeat(MAX_MESSAGE)).is_ok());
        let err = parse_message(&"x".repeat(MAX_MESSAGE + 1)).unwrap_err();
        assert!(err.contains("4097 bytes"), "{err}");
    }

    #[test]
    fn mapped_ipv4_shows_as_ipv4() {
        let mapped: SocketAddr = "[::ffff:169.254.0.1]:7471".parse().unwrap();
        assert_eq!(show_addr(Some(mapped)), "169.254.0.1:7471");
        let v6: SocketAddr = "[fe80::1%2]:7471".parse().unwrap();
        assert_eq!(show_addr(Some(v6)), "[fe80::1%2]:7471");
        assert_eq!(show_addr(None), "an unknown address");
    }
}
