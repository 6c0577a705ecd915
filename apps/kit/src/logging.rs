//! Logs (via `tracing`) go to stderr, never stdout: stdout is each
//! program's output (progress lines, reports, JSON).

/// The default filter of a program with a `-q` flag: warnings and errors,
/// only errors when quiet.
pub fn level(quiet: bool) -> &'static str {
    if quiet {
        "error"
    } else {
        "warn"
    }
}

/// Installs the stderr subscriber with the filter `default` (a `RUST_LOG`
/// directive), or whatever `RUST_LOG` says when it is set. A second call
/// keeps the first subscriber.
pub fn init_logging(default: &str) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
