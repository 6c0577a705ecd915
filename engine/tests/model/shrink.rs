//! The shrinker: a failing sequence cut down to one that still fails,
//! by dropping ever smaller runs of operations while the failure stays
//! (delta debugging). Every candidate runs on fresh connections.

use std::time::{Duration, Instant};

use crate::gen::Op;
use crate::rig::Failure;

/// The shortest failing sequence found within `budget`, and its failure.
pub fn shrink(
    ops: &[Op],
    first: Failure,
    budget: Duration,
    mut fails: impl FnMut(&[Op]) -> Option<Failure>,
) -> (Vec<Op>, Failure) {
    let start = Instant::now();
    // What follows the failing step cannot matter.
    let mut best: Vec<Op> = ops[..=first.step.min(ops.len() - 1)].to_vec();
    let mut failure = first;
    let mut chunk = best.len().div_ceil(2);
    while chunk > 0 && start.elapsed() < budget {
        let mut removed = false;
        let mut at = 0;
        while at < best.len() && start.elapsed() < budget {
            let candidate: Vec<Op> = best[..at]
                .iter()
                .chain(best.get(at + chunk..).unwrap_or(&[]))
                .copied()
                .collect();
            match fails(&candidate) {
                Some(f) => {
                    best = candidate[..=f.step.min(candidate.len().saturating_sub(1))].to_vec();
                    failure = f;
                    removed = true;
                }
                None => at += chunk,
            }
        }
        if !removed {
            chunk /= 2;
        }
    }
    (best, failure)
}
