//! [`AppHandle`]: the running app as handlers see it.

use std::future::Future;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::task::TaskTracker;

/// The running application, as seen from handlers: its runtime and the tracker
/// of the follow-up tasks a graceful shutdown waits for (RT-6, RT-8).
#[derive(Clone, Debug)]
pub struct AppHandle {
    runtime: Handle,
    tracker: TaskTracker,
}

impl AppHandle {
    /// The app on the current Tokio runtime.
    pub(crate) fn current() -> Self {
        AppHandle {
            runtime: Handle::current(),
            tracker: TaskTracker::new(),
        }
    }

    /// Spawns `future` on the app runtime, tracked.
    pub(crate) fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn_on(future, &self.runtime)
    }

    /// Waits for every tracked task; no new task can be tracked afterwards.
    pub(crate) async fn drain(&self) {
        self.tracker.close();
        self.tracker.wait().await;
    }
}
