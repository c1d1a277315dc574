//! Waiting for SIGINT / SIGTERM.

/// Resolves at the first SIGINT (Ctrl-C) or, on Unix, SIGTERM.
pub(crate) async fn terminate() -> std::io::Result<()> {
    // Tokio has no signals when built for the loom models (`--cfg loom`),
    // which never run an app.
    #[cfg(loom)]
    {
        std::future::pending().await
    }
    #[cfg(all(unix, not(loom)))]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(all(not(unix), not(loom)))]
    {
        tokio::signal::ctrl_c().await
    }
}
