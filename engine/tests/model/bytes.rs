//! What the bytes must be: the messages each side sends, numbered per
//! stream, and the static area each side's peer RDMA READs. Both ends
//! compute them, so every byte that arrives is checked.

/// A stream of messages; the number goes into each message's first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The peer's SENDs into this side's endpoint receives.
    PeerToEndpoint = 1,
    /// The peer's SENDs to this side's connection.
    PeerToConnection = 2,
    /// This side's SENDs from posted regions.
    EndpointToPeer = 3,
    /// This side's SENDs on the connection.
    ConnectionToPeer = 4,
}

/// Bytes at the start of every message: the stream and the number.
pub const HEADER: usize = 8;

/// Message `k` of `stream`, `len` (at least [`HEADER`]) bytes long.
pub fn message(stream: Stream, k: u64, len: usize) -> Vec<u8> {
    assert!(len >= HEADER);
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&((stream as u64) << 56 | k).to_le_bytes());
    out.extend((HEADER..len).map(|i| {
        (k.wrapping_mul(131) as u8)
            .wrapping_add((i as u8).wrapping_mul(7))
            .wrapping_add(stream as u8)
            ^ (i >> 8) as u8
    }));
    out
}

/// How long the peer's message `k` is (at most 256 bytes).
pub fn peer_message_len(k: u64) -> usize {
    HEADER + (k.wrapping_mul(97) % 249) as usize
}

/// Whether `data` is message `k` of `stream`, or how it is not.
pub fn check_message(stream: Stream, k: u64, data: &[u8]) -> Result<(), String> {
    if data.len() < HEADER {
        return Err(format!(
            "{stream:?} message {k}: {} bytes, shorter than its header",
            data.len()
        ));
    }
    let got = u64::from_le_bytes(data[..HEADER].try_into().unwrap());
    if got != ((stream as u64) << 56 | k) {
        return Err(format!(
            "{stream:?}: expected message {k}, got header {got:#x} ({} B): a completion or a buffer of another request",
            data.len()
        ));
    }
    if data != message(stream, k, data.len()) {
        return Err(format!("{stream:?} message {k}: header right, body wrong"));
    }
    Ok(())
}

/// The first bytes of each side's exposed region and target ring, which
/// nothing writes once set: what the other side's READs must return.
pub const STATIC: usize = 32 * 1024;

pub fn static_area() -> &'static [u8] {
    static AREA: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    AREA.get_or_init(|| pinpoll_testkit::pattern(STATIC, 0x5a))
}
