//! SIGINT and SIGTERM as a flag: the server finishes the client it is
//! serving (every wait in that is bounded by `--timeout`), then exits. A
//! second signal ends the process at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context as _;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::flag;

#[derive(Debug, Clone)]
pub struct Shutdown {
    requested: Arc<AtomicBool>,
}

impl Shutdown {
    /// Installs the handlers for SIGINT and SIGTERM.
    pub fn install() -> anyhow::Result<Shutdown> {
        let requested = Arc::new(AtomicBool::new(false));
        for (signal, status) in [(SIGINT, 130), (SIGTERM, 143)] {
            // Registered first, so it sees the flag as it was before this
            // signal: set means this is the second signal.
            flag::register_conditional_shutdown(signal, status, Arc::clone(&requested))
                .and_then(|_| flag::register(signal, Arc::clone(&requested)))
                .with_context(|| format!("installing a handler for signal {signal}"))?;
        }
        Ok(Shutdown { requested })
    }

    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::Relaxed)
    }
}
