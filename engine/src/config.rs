//! Queue-pair and connection tunables, checked before any verb runs.

use std::time::Duration;

use crate::error::{Error, Result};

/// Transport and queue settings of one reliable-connected queue pair.
///
/// Defaults suit production: a local ACK timeout of 14 (4.096 µs × 2^14 ≈ 67 ms)
/// with 7 retries, and a finite RNR retry so a stuck receiver surfaces as an
/// error instead of an endless stall.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpConfig {
    /// Send-queue depth in work requests.
    pub max_send_wr: u32,
    /// Receive-queue depth in work requests.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send and per receive.
    pub max_sge: u32,
    /// Bytes that may be posted inline (0 disables inline).
    pub max_inline_data: u32,
    /// Completion-queue depth of each of the send and receive CQs.
    pub cq_depth: u32,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout), 1..=31. Never 0:
    /// on rxe and many HCAs 0 means "wait forever" and nothing is retransmitted.
    pub timeout: u8,
    /// Transport retries before RETRY_EXC_ERR, 0..=7.
    pub retry_count: u8,
    /// RNR retries before RNR_RETRY_EXC_ERR, 0..=6 (7 would mean infinite).
    pub rnr_retry: u8,
    /// Minimum RNR NAK timer code advertised to the peer, 0..=31 (12 ≈ 0.64 ms).
    pub min_rnr_timer: u8,
    /// Outstanding RDMA READs this side may issue and serve, 1..=16.
    pub max_rd_atomic: u8,
    /// Port of the device to use (1-based).
    pub port: u8,
    /// GID index to use on RoCE; `None` selects the first RoCE v2 entry.
    pub gid_index: Option<u32>,
    /// Bound on rdma_cm address and route resolution, and on connection
    /// establishment.
    pub connect_timeout: Duration,
}

impl Default for QpConfig {
    fn default() -> Self {
        QpConfig {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_sge: 1,
            max_inline_data: 0,
            cq_depth: 256,
            timeout: 14,
            retry_count: 7,
            rnr_retry: 6,
            min_rnr_timer: 12,
            max_rd_atomic: 16,
            port: 1,
            gid_index: None,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

impl QpConfig {
    /// Checks every field against what the verbs accept, naming the field
    /// and its range on failure.
    pub fn validate(&self) -> Result<()> {
        fn range(name: &str, value: u64, lo: u64, hi: u64) -> Result<()> {
            if (lo..=hi).contains(&value) {
                Ok(())
            } else {
                Err(Error::Config(format!(
                    "{name} = {value} is out of range {lo}..={hi}"
                )))
            }
        }
        range("max_send_wr", self.max_send_wr.into(), 1, 1 << 16)?;
        range("max_recv_wr", self.max_recv_wr.into(), 1, 1 << 16)?;
        range("max_sge", self.max_sge.into(), 1, 32)?;
        range("max_inline_data", self.max_inline_data.into(), 0, 4096)?;
        range("cq_depth", self.cq_depth.into(), 1, 1 << 20)?;
        if self.timeout == 0 {
            return Err(Error::Config(
                "timeout = 0 disables retransmission (a lost packet then hangs the QP forever); use 1..=31, e.g. 14".into(),
            ));
        }
        range("timeout", self.timeout.into(), 1, 31)?;
        range("retry_count", self.retry_count.into(), 0, 7)?;
        if self.rnr_retry == 7 {
            return Err(Error::Config(
                "rnr_retry = 7 means retry forever (a stopped receiver then hangs the sender); use 0..=6".into(),
            ));
        }
        range("rnr_retry", self.rnr_retry.into(), 0, 6)?;
        range("min_rnr_timer", self.min_rnr_timer.into(), 0, 31)?;
        range("max_rd_atomic", self.max_rd_atomic.into(), 1, 16)?;
        range("port", self.port.into(), 1, 255)?;
        if self.connect_timeout.is_zero() {
            return Err(Error::Config("connect_timeout must be positive".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_never_disable_retransmission() {
        let cfg = QpConfig::default();
        cfg.validate().unwrap();
        assert_ne!(cfg.timeout, 0);
        assert!(cfg.rnr_retry < 7);
    }

    #[test]
    fn bad_values_name_the_field_and_range() {
        type Mutation = fn(&mut QpConfig);
        let cases: [(Mutation, &str); 5] = [
            (|c| c.timeout = 0, "timeout = 0 disables retransmission"),
            (|c| c.timeout = 32, "timeout = 32 is out of range 1..=31"),
            (|c| c.rnr_retry = 7, "rnr_retry = 7 means retry forever"),
            (
                |c| c.retry_count = 8,
                "retry_count = 8 is out of range 0..=7",
            ),
            (|c| c.max_send_wr = 0, "max_send_wr = 0 is out of range"),
        ];
        for (mutate, expected) in cases {
            let mut cfg = QpConfig::default();
            mutate(&mut cfg);
            let err = cfg.validate().unwrap_err().to_string();
            assert!(
                err.contains(expected),
                "{err:?} should contain {expected:?}"
            );
        }
    }
}
