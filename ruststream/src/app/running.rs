//! A started app and its ordered graceful shutdown.

use std::future::{Future, pending};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::join_all;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::AppHandle;
use super::hooks::{self, Hooks};
use super::register::{StartContext, StartUnit};
use crate::accept::AcceptLayer;
use crate::binding::erased::ErasedBroker;
use crate::host::{Abort, Stop};
use crate::middleware::SharedMiddleware;
use crate::subscriber::{StateKey, SubscriberConfig};
use crate::{Error, Result, metrics};

/// How long loops get, once aborted, to drop what they hold (an aborted
/// handler ends at its next await, nothing queued starts) before the
/// shutdown goes on without them.
const ABORT_GRACE: Duration = Duration::from_millis(100);

/// A running app: its subscriber loops are live.
///
/// [`shutdown`](RunningApp::shutdown) stops it in this order:
///
/// 1. `on_shutdown` hooks, brokers still connected;
/// 2. every loop stops taking new deliveries;
/// 3. deliveries in hand (in workers, owner FIFOs, thread rings) are processed
///    and settled — all subscribers drain in parallel;
/// 4. tracked follow-ups (`and_after`, `Ctx<MainRuntime>` spawns) finish and
///    pending `retry_after` timers publish at once;
/// 5. brokers close in reverse registration order;
/// 6. `after_shutdown` hooks.
///
/// With a shutdown timeout, steps 1–4 are bounded: when it expires,
/// handlers still running are aborted — their deliveries stay unsettled, so
/// the broker redelivers them; they are never acked — and unfinished tracked
/// tasks are left to finish on their own.
pub struct RunningApp {
    app: AppHandle,
    stop: Stop,
    /// Set when the shutdown timeout expires: handlers still running are
    /// dropped, their deliveries unsettled.
    abort: Abort,
    loops: Vec<JoinHandle<()>>,
    brokers: Vec<Arc<dyn ErasedBroker>>,
    /// Behind a mutex only to make `RunningApp` `Sync` (hooks need not be).
    on_shutdown: Mutex<Vec<hooks::Hook>>,
    after_shutdown: Mutex<Vec<hooks::Hook>>,
    shutdown_timeout: Option<Duration>,
    served: Served,
    /// Hands the subscribers' ack counts to the metrics recorder every
    /// second.
    metrics_sync: tokio::task::JoinHandle<()>,
}

/// The app's HTTP endpoints while it runs (nothing without the
/// `prometheus` feature or `serve_metrics`).
#[derive(Default)]
struct Served {
    #[cfg(feature = "prometheus")]
    running: Option<(
        tokio::task::JoinHandle<()>,
        super::endpoints::Readiness,
        Option<std::net::SocketAddr>,
    )>,
}

impl Served {
    #[cfg_attr(not(feature = "prometheus"), allow(clippy::unused_async))]
    async fn bind(addr: Option<std::net::SocketAddr>, app: &AppHandle) -> Result<Served> {
        #[cfg(feature = "prometheus")]
        if let Some(addr) = addr {
            let endpoints = super::endpoints::Endpoints::bind(addr).await?;
            let local = endpoints.local_addr();
            let readiness = endpoints.readiness();
            let task = endpoints.spawn(app.clone());
            return Ok(Served {
                running: Some((task, readiness, local)),
            });
        }
        let _ = (addr, app);
        Ok(Served::default())
    }

    /// Every subscription started: `/ready` answers 200.
    fn ready(&self) {
        #[cfg(feature = "prometheus")]
        if let Some((_, readiness, _)) = &self.running {
            readiness.set(true);
        }
    }

    fn addr(&self) -> Option<std::net::SocketAddr> {
        #[cfg(feature = "prometheus")]
        if let Some((_, _, addr)) = &self.running {
            return *addr;
        }
        None
    }

    /// The shutdown is over: stop serving.
    fn stop(&self) {
        #[cfg(feature = "prometheus")]
        if let Some((task, readiness, _)) = &self.running {
            readiness.set(false);
            task.abort();
        }
    }
}

impl std::fmt::Debug for RunningApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningApp")
            .field("loops", &self.loops.len())
            .field(
                "brokers",
                &self.brokers.iter().map(|b| b.name()).collect::<Vec<_>>(),
            )
            .field("shutdown_timeout", &self.shutdown_timeout)
            .finish()
    }
}

/// What [`App::start`](crate::App::start) hands over.
pub(crate) struct Parts {
    pub(crate) brokers: Vec<Arc<dyn ErasedBroker>>,
    pub(crate) units: Vec<Box<dyn StartUnit>>,
    pub(crate) layers: Arc<[Arc<dyn AcceptLayer>]>,
    pub(crate) middleware: Arc<[SharedMiddleware]>,
    pub(crate) hooks: Hooks,
    pub(crate) app: AppHandle,
    pub(crate) shutdown_timeout: Option<Duration>,
    pub(crate) endpoints: Option<std::net::SocketAddr>,
}

impl RunningApp {
    pub(super) async fn start(parts: Parts) -> Result<RunningApp> {
        let Parts {
            brokers,
            units,
            layers,
            middleware,
            hooks,
            app,
            shutdown_timeout,
            endpoints,
        } = parts;
        for unit in &units {
            unit.config().validate()?;
            check_state(|id| app.has_state(id), unit.config(), unit.requires())?;
        }
        let served = Served::bind(endpoints, &app).await?;
        hooks::run(hooks.on_startup, &app, "on_startup", true).await?;
        let stop = Stop::default();
        let abort = Abort::default();
        let mut running = RunningApp {
            app: app.clone(),
            stop: stop.clone(),
            abort: abort.clone(),
            loops: Vec::with_capacity(units.len()),
            brokers,
            on_shutdown: Mutex::new(hooks.on_shutdown),
            after_shutdown: Mutex::new(hooks.after_shutdown),
            shutdown_timeout,
            served,
            metrics_sync: tokio::spawn(sync_metrics(app.clone())),
        };
        for unit in units {
            let subject = unit.config().subject().to_string();
            let (handler, _) = unit.requires();
            let broker = unit.broker_name();
            let mode = unit.config().mode();
            let cx = StartContext {
                layers: Arc::clone(&layers),
                middleware: Arc::clone(&middleware),
                stop: stop.clone(),
                abort: abort.clone(),
                app: app.clone(),
            };
            match unit.start(cx).await {
                Ok(handle) => {
                    // Which broker serves which subject, spelled out: a
                    // subscriber added after the wrong `.broker(..)` shows here.
                    tracing::info!(subject, broker, handler, ?mode, "subscriber started");
                    running.loops.push(handle);
                }
                Err(err) => {
                    tracing::error!(subject, error = %err, "subscribe failed; stopping");
                    // Stop what already started, then report the first error.
                    let _ = running.shutdown().await;
                    return Err(err);
                }
            }
        }
        tracing::info!(subscribers = running.loops.len(), "app started");
        if let Err(err) = hooks::run(hooks.after_startup, &app, "after_startup", true).await {
            let _ = running.shutdown().await;
            return Err(err);
        }
        running.served.ready();
        Ok(running)
    }

    /// Job-queue pressure: state, permits in use, max, pause count and time
    /// paused.
    pub fn pressure(&self) -> crate::ingress::Pressure {
        self.app.pressure()
    }

    /// A [`Publisher`](crate::Publisher) on the first registered broker of
    /// type `B` (see [`AppHandle::publisher`]).
    pub fn publisher<B: crate::Broker>(&self) -> Option<crate::Publisher<B>> {
        self.app.publisher::<B>()
    }

    /// Where `/metrics`, `/health` and `/ready` are served
    /// ([`App::serve_metrics`](crate::App::serve_metrics)), if they are.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.served.addr()
    }

    /// The app as handlers see it: shared state, shutdown requests.
    pub fn handle(&self) -> &AppHandle {
        &self.app
    }

    /// Resolves when a shutdown was requested from inside the app: a
    /// fail-fast subscriber gave up, or [`AppHandle::request_shutdown`].
    pub async fn wait(&self) {
        self.app.shutdown_requested().cancelled().await
    }

    /// Ordered graceful shutdown, bounded by the shutdown timeout if
    /// one is set. Returns the first error met; every step still runs.
    pub async fn shutdown(self) -> Result<()> {
        self.shutdown_or_force(pending()).await
    }

    /// [`shutdown`](Self::shutdown), where `force` resolving (e.g. a second
    /// SIGINT) takes the timeout path at once.
    pub(crate) async fn shutdown_or_force(
        mut self,
        force: impl Future<Output = ()> + Send + 'static,
    ) -> Result<()> {
        self.app.request_shutdown();
        // The timeout (or `force`) flips this once; every bounded phase
        // below races it, and a phase after expiry does not wait at all.
        let expired = CancellationToken::new();
        let deadline = self.shutdown_timeout.map(|t| Instant::now() + t);
        let timer = tokio::spawn({
            let expired = expired.clone();
            async move {
                let timeout = async {
                    match deadline {
                        Some(deadline) => tokio::time::sleep_until(deadline).await,
                        None => pending().await,
                    }
                };
                tokio::select! {
                    () = timeout => {}
                    () = force => {}
                }
                expired.cancel();
            }
        });
        let mut first_error = None;

        // 1. on_shutdown hooks, brokers still connected.
        let on_shutdown = take(&self.on_shutdown);
        let hooks_done = tokio::select! {
            r = hooks::run(on_shutdown, &self.app, "on_shutdown", false) => Some(r),
            () = expired.cancelled() => None,
        };
        match hooks_done {
            Some(Err(err)) => {
                first_error.get_or_insert(err);
            }
            Some(Ok(())) => {}
            None => tracing::warn!("shutdown timeout expired during on_shutdown hooks"),
        }

        // 2 + 3. Stop taking deliveries; every loop drains what it holds, in
        // parallel.
        self.stop.stop();
        let aborts: Vec<_> = self.loops.iter().map(JoinHandle::abort_handle).collect();
        let mut loops = join_all(self.loops.drain(..));
        let joined = tokio::select! {
            joined = &mut loops => Some(joined),
            () = expired.cancelled() => None,
        };
        let joined = match joined {
            Some(joined) => joined,
            None => {
                // RT-10: abort what still runs. Handlers waiting are dropped
                // and nothing queued starts; their deliveries stay unsettled,
                // so the broker redelivers them. A handler stuck in blocking
                // code cannot be dropped: it is left to end on its own, and
                // the shutdown goes on.
                tracing::warn!("shutdown timeout expired: aborting handlers still running");
                self.abort.cancel();
                metrics::aborted(1);
                tokio::select! {
                    joined = loops => joined,
                    () = tokio::time::sleep(ABORT_GRACE) => {
                        for abort in &aborts {
                            abort.abort();
                        }
                        tracing::warn!("a subscriber loop is still in a handler's blocking code: left to end on its own");
                        Vec::new()
                    }
                }
            }
        };
        for result in joined {
            if let Err(err) = result
                && !err.is_cancelled()
            {
                tracing::error!(error = %err, "subscriber loop ended abnormally");
                first_error.get_or_insert(Error::App(err.into()));
            }
        }

        // 4. Tracked follow-ups finish; retry timers publish now.
        self.app.flush_retries().cancel();
        tokio::select! {
            () = self.app.wait_tracked() => {}
            () = expired.cancelled() => {
                tracing::warn!(
                    detached = self.app.tracked(),
                    "shutdown timeout expired: unfinished tracked tasks detached"
                );
            }
        }

        // 5. Brokers close in reverse registration order.
        for broker in self.brokers.iter().rev() {
            if let Err(err) = broker.close().await {
                tracing::warn!(broker = broker.name(), error = %err, "broker close failed");
                first_error.get_or_insert(err);
            }
        }

        // 6. after_shutdown hooks, brokers closed.
        let after_shutdown = take(&self.after_shutdown);
        if let Err(err) = hooks::run(after_shutdown, &self.app, "after_shutdown", false).await {
            first_error.get_or_insert(err);
        }
        timer.abort();
        self.metrics_sync.abort();
        self.app.metrics().sync();
        self.served.stop();
        tracing::info!("app stopped");
        first_error.map_or(Ok(()), Err)
    }
}

/// Every second: the acks counted since, to the metrics recorder.
async fn sync_metrics(app: AppHandle) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        app.metrics().sync();
    }
}

fn take(hooks: &Mutex<Vec<hooks::Hook>>) -> Vec<hooks::Hook> {
    std::mem::take(&mut *hooks.lock().unwrap_or_else(|e| e.into_inner()))
}

/// A startup error unless every shared state type a subscriber's handler
/// takes is registered: a missing one would fail every delivery, so it is a
/// configuration mistake.
pub(super) fn check_state(
    has_state: impl Fn(std::any::TypeId) -> bool,
    config: &SubscriberConfig,
    (handler, states): (&'static str, Vec<StateKey>),
) -> Result<()> {
    match states.iter().find(|key| !has_state(key.id())) {
        Some(missing) => Err(Error::Config(format!(
            "subscriber `{}` (handler `{handler}`) takes `State<{}>`, but the app has no state of that type: register it with `App::state(..)`",
            config.subject(),
            missing.name()
        ))),
        None => Ok(()),
    }
}
