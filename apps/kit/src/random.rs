//! Secrets a peer must not guess (a transfer's join token, a measurement's
//! data-connection nonce): from the operating system's random source.

/// 64 random bits from getrandom(2), which blocks only until the kernel's
/// pool is first seeded (early in boot).
pub fn random_u64() -> std::io::Result<u64> {
    let mut bytes = [0u8; 8];
    let mut filled = 0;
    while filled < bytes.len() {
        match rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(u64::from_ne_bytes(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_differ() {
        let draws: std::collections::HashSet<u64> =
            (0..64).map(|_| random_u64().unwrap()).collect();
        assert_eq!(draws.len(), 64);
    }
}
