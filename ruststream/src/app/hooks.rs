//! Lifecycle hooks: async closures the app runs at startup and shutdown.

use std::future::Future;

use super::AppHandle;
use crate::binding::erased::BoxFuture;
use crate::{BoxError, Error, Result};

/// One hook: gets the app handle (for shared state and shutdown requests).
pub(crate) type Hook =
    Box<dyn FnOnce(AppHandle) -> BoxFuture<'static, Result<(), BoxError>> + Send>;

pub(crate) fn hook<F, Fut>(f: F) -> Hook
where
    F: FnOnce(AppHandle) -> Fut + Send + 'static,
    Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
{
    Box::new(move |app| Box::pin(f(app)))
}

/// The hooks of each phase, in registration order.
#[derive(Default)]
pub(crate) struct Hooks {
    /// Before any subscription opens; the first error stops the start.
    pub(crate) on_startup: Vec<Hook>,
    /// After every subscriber runs; an error shuts the app down.
    pub(crate) after_startup: Vec<Hook>,
    /// First step of a shutdown: brokers are still connected.
    pub(crate) on_shutdown: Vec<Hook>,
    /// Last step of a shutdown: brokers are closed.
    pub(crate) after_shutdown: Vec<Hook>,
}

/// Runs `hooks` in order. With `stop_at_error`, the first error ends the
/// phase; otherwise every hook runs and the first error is reported.
pub(crate) async fn run(
    hooks: Vec<Hook>,
    app: &AppHandle,
    phase: &'static str,
    stop_at_error: bool,
) -> Result<()> {
    let mut first = None;
    for hook in hooks {
        if let Err(err) = hook(app.clone()).await {
            tracing::error!(phase, error = %err, "lifecycle hook failed");
            first.get_or_insert(Error::App(format!("{phase} hook failed: {err}").into()));
            if stop_at_error {
                break;
            }
        }
    }
    first.map_or(Ok(()), Err)
}
