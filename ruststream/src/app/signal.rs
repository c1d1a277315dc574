//! Waiting for SIGINT / SIGTERM.

/// Resolves at the first SIGINT (Ctrl-C) or, on Unix, SIGTERM.
pub(crate) async fn terminate() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
