//! Parsing `host:port` with IPv6 scopes by interface name (`fe80::1%eth0`),
//! which `std` does not accept.

use std::net::{IpAddr, Ipv6Addr, SocketAddr, SocketAddrV6};

use crate::error::{Error, Result};
use crate::sys::cm::interface_index;

/// Parses an IP address (IPv6 optionally `%scope`, by name or number) and
/// joins it with `port`.
///
/// ```
/// use pinpoll::connect::parse_socket_addr;
///
/// assert_eq!(parse_socket_addr("169.254.0.1", 7471)?.to_string(), "169.254.0.1:7471");
/// assert!(parse_socket_addr("not an address", 1).is_err());
/// # Ok::<(), pinpoll::Error>(())
/// ```
pub fn parse_socket_addr(host: &str, port: u16) -> Result<SocketAddr> {
    let bad = |detail: String| Error::Address {
        what: host.to_owned(),
        detail,
    };
    let host = host.trim().trim_start_matches('[').trim_end_matches(']');
    if let Some((ip, scope)) = host.split_once('%') {
        let ip: Ipv6Addr = ip.parse().map_err(|e| bad(format!("{e}")))?;
        let scope_id = match scope.parse::<u32>() {
            Ok(n) => n,
            Err(_) => interface_index(scope)
                .ok_or_else(|| bad(format!("no network interface named {scope:?}")))?,
        };
        return Ok(SocketAddr::V6(SocketAddrV6::new(ip, port, 0, scope_id)));
    }
    let ip: IpAddr = host.parse().map_err(|e| {
        bad(format!(
            "{e} (give an IPv4 or IPv6 address; link-local IPv6 needs %interface)"
        ))
    })?;
    if let IpAddr::V6(v6) = ip {
        if v6.segments()[0] & 0xffc0 == 0xfe80 {
            return Err(bad(
                "an IPv6 link-local address needs a scope, e.g. fe80::1%eth0".into(),
            ));
        }
    }
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ipv4_ipv6_and_numeric_scopes() {
        assert_eq!(
            parse_socket_addr("169.254.0.1", 7471).unwrap().to_string(),
            "169.254.0.1:7471"
        );
        let v6 = parse_socket_addr("fe80::5054:ff:fe50:1%3", 1).unwrap();
        match v6 {
            SocketAddr::V6(a) => assert_eq!(a.scope_id(), 3),
            _ => panic!("expected v6"),
        }
        // The loopback interface exists everywhere.
        let lo = parse_socket_addr("[fe80::1%lo]", 9).unwrap();
        assert!(matches!(lo, SocketAddr::V6(a) if a.scope_id() > 0));
    }

    #[test]
    fn rejects_unscoped_link_local_and_unknown_interfaces() {
        let err = parse_socket_addr("fe80::1", 1).unwrap_err().to_string();
        assert!(err.contains("needs a scope"), "{err}");
        let err = parse_socket_addr("fe80::1%nosuchif0", 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("no network interface named \"nosuchif0\""),
            "{err}"
        );
        assert!(parse_socket_addr("not-an-ip", 1).is_err());
    }
}
