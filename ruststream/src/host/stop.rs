//! The stop signal of a running app's loops: a flag read on every delivery
//! (one atomic load) plus a notification for loops that are waiting.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Clone, Default)]
pub(crate) struct Stop(Arc<Inner>);

#[derive(Default)]
struct Inner {
    stopped: AtomicBool,
    notify: Notify,
}

impl Stop {
    /// Asks every loop to stop taking new deliveries. Idempotent.
    pub(crate) fn stop(&self) {
        self.0.stopped.store(true, Ordering::Release);
        self.0.notify.notify_waiters();
    }

    #[inline]
    pub(crate) fn is_stopped(&self) -> bool {
        self.0.stopped.load(Ordering::Acquire)
    }

    /// Resolves when either future does.
    pub(crate) async fn race(a: impl Future<Output = ()>, b: impl Future<Output = ()>) {
        tokio::select! {
            () = a => {}
            () = b => {}
        }
    }

    /// Resolves once [`stop`](Self::stop) was called (at once if it was).
    pub(crate) async fn wait(&self) {
        loop {
            let mut notified = pin!(self.0.notify.notified());
            notified.as_mut().enable();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}
