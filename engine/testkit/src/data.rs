//! Deterministic test data and the SHA-256 of files (a hash of the tests'
//! own, independent of anything the code under test computes).

use std::io::Read;
use std::path::Path;

use sha2::{Digest, Sha256};

/// A deterministic, position-dependent pattern, different per `seed`.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// Writes `len` pseudo-random bytes (a fixed xorshift stream per `seed`).
pub fn random_file(path: &Path, len: usize, seed: u64) {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(len);
    std::fs::write(path, data).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

/// The SHA-256 of the file at `path`.
pub fn sha256(path: &Path) -> [u8; 32] {
    let mut f =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    h.finalize().into()
}
