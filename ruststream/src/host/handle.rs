//! [`AppHandle`]: the running app as handlers and hooks see it.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::binding::Broker;
use crate::binding::erased::ErasedBroker;
use crate::ingress::{JobQueue, JobQueueSettings, Pressure};
use crate::outgoing::Outgoing;
use crate::{Envelope, Publisher};

/// The app's after-ack hook.
pub(crate) type AfterAck =
    Arc<dyn Fn(Envelope) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Typed shared state, one value per type.
pub(crate) type StateMap = HashMap<TypeId, Arc<dyn Any + Send + Sync>>;

/// The running application, as seen from handlers and lifecycle hooks: its
/// runtime, its typed shared state, and the tracker of follow-up tasks a
/// graceful shutdown waits for. Cheap to clone.
#[derive(Clone)]
pub struct AppHandle {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Handle,
    tracker: TaskTracker,
    state: StateMap,
    after_ack: Option<AfterAck>,
    /// The app's job queue: one permit pool for every subscription.
    jobs: Arc<JobQueue>,
    /// Asks pending `retry_after` timers to publish at once.
    flush_retries: CancellationToken,
    /// Asks the app to shut down (fail-fast, `RunningApp::shutdown`).
    shutdown: CancellationToken,
    /// Every registered broker, for typed publisher lookups.
    brokers: Vec<Arc<dyn ErasedBroker>>,
    /// Hooks on every message the app sends.
    outgoing: Outgoing,
    /// Every subscriber's metric handles, to sync.
    metrics: crate::metrics::Registry,
}

impl std::fmt::Debug for AppHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppHandle")
            .field("tracked_tasks", &self.inner.tracker.len())
            .field("states", &self.inner.state.len())
            .finish_non_exhaustive()
    }
}

impl AppHandle {
    /// The app on the current Tokio runtime, with its shared state.
    pub(crate) fn new(
        name: &str,
        state: StateMap,
        after_ack: Option<AfterAck>,
        jobs: &JobQueueSettings,
        brokers: Vec<Arc<dyn ErasedBroker>>,
        outgoing: Outgoing,
    ) -> crate::Result<Self> {
        Ok(AppHandle {
            inner: Arc::new(Inner {
                runtime: Handle::current(),
                tracker: TaskTracker::new(),
                state,
                after_ack,
                jobs: JobQueue::for_app(jobs, name)?,
                flush_retries: CancellationToken::new(),
                shutdown: CancellationToken::new(),
                brokers,
                outgoing,
                metrics: crate::metrics::Registry::named(name),
            }),
        })
    }

    /// The job queue.
    pub(crate) fn jobs(&self) -> &Arc<JobQueue> {
        &self.inner.jobs
    }

    /// A [`Publisher`] on the first registered broker of type `B`, or `None`
    /// when the app has none.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let running = App::new().broker(MemoryBroker::new()).start().await?;
    /// let out = running.publisher::<MemoryBroker>().expect("a memory broker");
    /// out.publish("greetings", &"hi").await?;
    /// running.shutdown().await?;
    /// # Ok::<_, ruststream::Error>(()) }).unwrap();
    /// ```
    pub fn publisher<B: Broker>(&self) -> Option<Publisher<B>> {
        self.inner
            .brokers
            .iter()
            .find_map(|b| b.as_any().downcast_ref::<B>())
            .map(|b| Publisher::of_app(b.clone(), self.outgoing().clone()))
    }

    /// The hooks every outgoing message goes through.
    pub(crate) fn outgoing(&self) -> &Outgoing {
        &self.inner.outgoing
    }

    /// Job-queue pressure: state, permits in use, pauses.
    pub fn pressure(&self) -> Pressure {
        self.inner.jobs.pressure()
    }

    /// The shared state of type `T` registered with
    /// [`App::state`](crate::App::state).
    pub fn state<T: Send + Sync + 'static>(&self) -> Option<Arc<T>> {
        let value = self.inner.state.get(&TypeId::of::<T>())?;
        Arc::clone(value).downcast::<T>().ok()
    }

    /// Whether a shared state value of this type is registered.
    pub(crate) fn has_state(&self, id: TypeId) -> bool {
        self.inner.state.contains_key(&id)
    }

    /// Asks the app to shut down gracefully, from anywhere (a handler, a hook,
    /// another task). `App::run` and `RunningApp::wait` return to shut down.
    pub fn request_shutdown(&self) {
        self.inner.shutdown.cancel();
    }

    /// Spawns `future` on the app runtime, tracked: a graceful shutdown waits
    /// for it.
    pub(crate) fn spawn<F>(&self, future: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.inner.tracker.spawn_on(future, &self.inner.runtime)
    }

    /// Every subscriber's metric handles.
    pub(crate) fn metrics(&self) -> &crate::metrics::Registry {
        &self.inner.metrics
    }

    pub(crate) fn has_after_ack(&self) -> bool {
        self.inner.after_ack.is_some()
    }

    /// Starts the after-ack hook for an acked delivery, tracked.
    pub(crate) fn acked(&self, env: &Envelope) {
        if let Some(hook) = &self.inner.after_ack {
            self.spawn(hook(env.clone()));
        }
    }

    pub(crate) fn shutdown_requested(&self) -> &CancellationToken {
        &self.inner.shutdown
    }

    pub(crate) fn flush_retries(&self) -> &CancellationToken {
        &self.inner.flush_retries
    }

    /// Closes the tracker: tasks spawned from now on are still run, and
    /// [`wait_tracked`](Self::wait_tracked) waits for all of them.
    pub(crate) async fn wait_tracked(&self) {
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }

    /// Tracked tasks still running.
    pub(crate) fn tracked(&self) -> usize {
        self.inner.tracker.len()
    }
}
