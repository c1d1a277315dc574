//! The shutdown timeout's abort signal (RT-10): a flag the pipeline reads
//! before it starts each handler — a load, where
//! `CancellationToken::is_cancelled` takes a mutex (see `stop.rs`) — and a
//! token the handlers in flight wait on. Not a second `Stop`: a
//! handler's wait for it is pinned in its loop's future, and a `Stop`'s wait
//! is larger than a token's (+6 instructions per message, measured).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

#[derive(Clone, Default)]
pub(crate) struct Abort(Arc<Inner>);

#[derive(Default)]
struct Inner {
    aborted: AtomicBool,
    token: CancellationToken,
}

impl Abort {
    /// Aborts: nothing more starts, and what runs is dropped at its next
    /// await. Idempotent.
    pub(crate) fn cancel(&self) {
        self.0.aborted.store(true, Ordering::Release);
        self.0.token.cancel();
    }

    #[inline]
    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.aborted.load(Ordering::Acquire)
    }

    /// Resolves once [`cancel`](Self::cancel) was called.
    pub(crate) fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.0.token.cancelled()
    }
}
