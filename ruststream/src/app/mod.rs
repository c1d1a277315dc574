//! The application: brokers, subscribers and the runtime that drives them.

#[cfg(feature = "asyncapi")]
mod asyncapi;
mod check;
#[cfg(feature = "prometheus")]
mod endpoints;
mod hooks;
mod register;
mod running;
#[cfg(feature = "config")]
mod settings;
mod signal;

use std::sync::Arc;

pub use register::{BoundSubscriber, Configure, Configured, IntoSubscriber};
pub use running::RunningApp;

use std::any::{Any, TypeId};
use std::future::Future;
use std::time::Duration;

use self::hooks::Hooks;
use self::register::StartUnit;
use self::running::Parts;
use crate::accept::AcceptLayer;
use crate::binding::Broker;
use crate::binding::erased::ErasedBroker;
use crate::host::{AfterAck, AppHandle, StateMap};
use crate::ingress::JobQueueSettings;
use crate::middleware::{Middleware, SharedMiddleware};
use crate::outgoing::{OnPublish, Outgoing};
use crate::{BoxError, Error, Result};

/// Type of an [`App`] before its first broker is registered.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoBroker;

/// An application under construction: brokers, the subscribers attached to
/// them, and app-wide settings.
///
/// Subscribers attach to the broker registered most recently before them; the
/// type parameter is that broker's type, so the per-message loop is compiled
/// for it (no dynamic dispatch per message).
///
/// ```
/// use ruststream::prelude::*;
///
/// // `String` bodies and replies are raw UTF-8 payloads, not JSON.
/// #[subscriber("greetings")]
/// async fn greet(name: String) -> String {
///     format!("hello, {name}")
/// }
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let broker = MemoryBroker::new();
/// let app = App::new().broker(broker.clone()).subscriber(greet);
/// let running = app.start().await?;
/// let reply = broker
///     .request_message("greetings", Message::new("ada"), std::time::Duration::from_secs(1))
///     .await?;
/// assert_eq!(reply.payload(), "hello, ada".as_bytes());
/// running.shutdown().await?;
/// # Ok::<_, ruststream::Error>(()) }).unwrap();
/// ```
pub struct App<B = NoBroker> {
    current: B,
    brokers: Vec<Arc<dyn ErasedBroker>>,
    units: Vec<Box<dyn StartUnit>>,
    layers: Vec<Arc<dyn AcceptLayer>>,
    middleware: Vec<SharedMiddleware>,
    on_publish: Vec<Arc<dyn OnPublish>>,
    hooks: Hooks,
    state: StateMap,
    after_ack: Option<AfterAck>,
    jobs: JobQueueSettings,
    shutdown_timeout: Option<Duration>,
    /// Mistakes the builder cannot refuse by type, reported by `start`.
    mistakes: Vec<Error>,
    /// Where to serve `/metrics`, `/health` and `/ready`, if anywhere.
    endpoints: Option<std::net::SocketAddr>,
    /// The `app` label of the app's metrics.
    name: String,
    /// Publishers declared for documents ([`App::publishes`]).
    #[cfg(feature = "asyncapi")]
    published: Vec<crate::asyncapi::Publication>,
}

impl App<NoBroker> {
    /// An empty app.
    pub fn new() -> Self {
        App {
            current: NoBroker,
            brokers: Vec::new(),
            units: Vec::new(),
            layers: Vec::new(),
            middleware: Vec::new(),
            on_publish: Vec::new(),
            hooks: Hooks::default(),
            state: StateMap::new(),
            after_ack: None,
            jobs: JobQueueSettings::default(),
            shutdown_timeout: crate::launch::default_shutdown_timeout(),
            mistakes: Vec::new(),
            endpoints: None,
            name: "app".to_owned(),
            #[cfg(feature = "asyncapi")]
            published: Vec::new(),
        }
    }
}

impl Default for App<NoBroker> {
    fn default() -> Self {
        App::new()
    }
}

impl<B> App<B> {
    /// Registers a broker. Subscribers added after this call consume from it.
    /// At shutdown brokers close in reverse registration order.
    pub fn broker<N: Broker>(mut self, broker: N) -> App<N> {
        self.brokers.push(Arc::new(broker.clone()));
        self.with_current(broker)
    }

    /// The same app, adding subscribers to `current` from now on.
    fn with_current<N>(self, current: N) -> App<N> {
        App {
            current,
            brokers: self.brokers,
            units: self.units,
            layers: self.layers,
            middleware: self.middleware,
            on_publish: self.on_publish,
            hooks: self.hooks,
            state: self.state,
            after_ack: self.after_ack,
            jobs: self.jobs,
            shutdown_timeout: self.shutdown_timeout,
            mistakes: self.mistakes,
            endpoints: self.endpoints,
            name: self.name,
            #[cfg(feature = "asyncapi")]
            published: self.published,
        }
    }

    /// The same app on `broker` alone: every subscriber rebound to it, every
    /// registered broker replaced by it (`TestApp`). Also returns the dead
    /// letter subjects of the subscribers, to watch: each once, however
    /// many subscribers share it.
    #[cfg(feature = "testing")]
    pub(crate) fn on_memory(
        mut self,
        broker: crate::MemoryBroker,
    ) -> (App<crate::MemoryBroker>, Vec<crate::Text>) {
        let mut dead_letters: Vec<crate::Text> = self
            .units
            .iter()
            .filter_map(|unit| unit.config().dead_letter.clone())
            .collect();
        dead_letters.sort_unstable();
        dead_letters.dedup();
        let units = std::mem::take(&mut self.units)
            .into_iter()
            .map(|unit| unit.rebind(broker.clone()))
            .collect();
        self.units = units;
        self.brokers = vec![Arc::new(broker.clone())];
        let app = self.with_current(broker);
        (app, dead_letters)
    }

    /// Names the app: the `app` label of its per-subscriber metrics
    /// (`ruststream_handled_total` and the handler timings), so two apps in
    /// one process are told apart. Default: `app`.
    ///
    /// ```
    /// use ruststream::{App, MemoryBroker};
    ///
    /// let app = App::new().name("billing").broker(MemoryBroker::new());
    /// # drop(app);
    /// ```
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sizes the application job queue: one permit per record taken
    /// from a broker and not yet started by its handler, shared by every
    /// subscription. Invalid settings are a startup error.
    ///
    /// ```
    /// use ruststream::{App, MemoryBroker};
    /// use ruststream::ingress::{JobQueueProfile, JobQueueSettings};
    ///
    /// let app = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .job_queue(JobQueueSettings::profile(JobQueueProfile::Small).max_queued_jobs(64));
    /// # drop(app);
    /// ```
    pub fn job_queue(mut self, settings: JobQueueSettings) -> Self {
        self.jobs = settings;
        self
    }

    /// Runs `hook` after every acked delivery of every subscriber, as a task
    /// the app tracks: it starts after the ack, once per delivery, and
    /// a graceful shutdown waits for it.
    ///
    /// ```
    /// use ruststream::{App, Envelope, MemoryBroker};
    ///
    /// let app = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .after_ack(|env: Envelope| async move {
    ///         tracing::debug!(subject = %env.subject(), "acked");
    ///     });
    /// # drop(app);
    /// ```
    pub fn after_ack<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(crate::Envelope) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.after_ack = Some(Arc::new(move |env| Box::pin(hook(env))));
        self
    }

    /// Shares `value` with every handler (`ctx.state::<T>()`) and hook
    /// (`app.state::<T>()`). One value per type; a second call replaces it.
    pub fn state<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        let value: Arc<dyn Any + Send + Sync> = Arc::new(value);
        self.state.insert(TypeId::of::<T>(), value);
        self
    }

    /// Bounds the graceful shutdown. When it expires, handlers still
    /// running are aborted (their deliveries stay unsettled and are
    /// redelivered) and unfinished tracked tasks are detached. Default: the
    /// `#[ruststream::app(shutdown_timeout = ..)]` binary's, else none (the
    /// shutdown waits for everything).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = Some(timeout);
        self
    }

    /// Runs before any subscription opens. An error stops the start: `start`
    /// and `run` return it (and `#[ruststream::app]` exits non-zero).
    ///
    /// ```
    /// use ruststream::{App, MemoryBroker};
    ///
    /// let app = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .on_startup(|_app| async { Ok(()) });
    /// # drop(app);
    /// ```
    pub fn on_startup<F, Fut>(mut self, hook: F) -> Self
    where
        F: FnOnce(AppHandle) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.hooks.on_startup.push(hooks::hook(hook));
        self
    }

    /// Runs once every subscriber runs.
    pub fn after_startup<F, Fut>(mut self, hook: F) -> Self
    where
        F: FnOnce(AppHandle) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.hooks.after_startup.push(hooks::hook(hook));
        self
    }

    /// First step of a shutdown: brokers are still connected, so it may
    /// publish.
    pub fn on_shutdown<F, Fut>(mut self, hook: F) -> Self
    where
        F: FnOnce(AppHandle) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.hooks.on_shutdown.push(hooks::hook(hook));
        self
    }

    /// Last step of a shutdown: brokers are closed.
    pub fn after_shutdown<F, Fut>(mut self, hook: F) -> Self
    where
        F: FnOnce(AppHandle) -> Fut + Send + 'static,
        Fut: Future<Output = Result<(), BoxError>> + Send + 'static,
    {
        self.hooks.after_shutdown.push(hooks::hook(hook));
        self
    }

    /// Adds an accept layer run on every delivery of every subscriber, before
    /// decode, in the order added.
    pub fn layer(mut self, layer: impl AcceptLayer) -> Self {
        self.layers.push(Arc::new(layer));
        self
    }

    /// Wraps every subscriber's handler in a [`tower::Layer`] — a timeout,
    /// a concurrency limit, one's own — after decode, around the handler
    /// (see [`middleware`](crate::middleware)). The first added runs
    /// outermost, around each subscriber's own
    /// ([`SubscriberConfig::middleware`](crate::subscriber::SubscriberConfig::middleware)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream::prelude::*;
    /// use tower::timeout::TimeoutLayer;
    ///
    /// #[subscriber("reports")]
    /// async fn report(_job: Bytes) {}
    ///
    /// let app = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .middleware(TimeoutLayer::new(Duration::from_secs(30)))
    ///     .subscriber(report);
    /// # drop(app);
    /// ```
    pub fn middleware(mut self, layer: impl Middleware) -> Self {
        self.middleware.push(SharedMiddleware(Arc::new(layer)));
        self
    }

    /// Publish-side middleware: `hook` sees every message the app sends —
    /// what handlers publish and request through their [`Ctx`](crate::Ctx),
    /// the replies they return, and sends through the app's publishers
    /// ([`RunningApp::publisher`], [`Ctx::publisher`](crate::Ctx::publisher))
    /// — just before the broker, with the subject it goes to. Hooks run in
    /// the order added. A [`Publisher::new`](crate::Publisher::new) made
    /// outside the app, and the copies brokers make themselves (dead
    /// letters, redeliveries), do not pass through them.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// let app = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .on_publish(|_subject: &str, message: &mut Message| {
    ///         message.headers_mut().insert("app", "billing");
    ///     });
    /// # drop(app);
    /// ```
    pub fn on_publish(mut self, hook: impl OnPublish) -> Self {
        self.on_publish.push(Arc::new(hook));
        self
    }
}

impl<B: Broker> App<B> {
    /// Adds a subscriber on the current broker (the one registered last): a
    /// `#[subscriber]` function, or any
    /// [`Subscriber`](crate::subscriber::Subscriber) value. With several
    /// brokers, [`subscriber_on`](Self::subscriber_on) names the one; either
    /// way the app logs at start which broker serves each subject.
    pub fn subscriber<M>(mut self, subscriber: impl IntoSubscriber<M>) -> Self {
        self.units
            .push(subscriber.into_unit(self.current.clone()).0);
        self
    }

    /// Adds a subscriber on the registered broker of type `T`, whatever was
    /// registered last: the binding is spelled out where the subscriber is
    /// added. No broker of that type is a startup error.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// #[subscriber("payments")]
    /// async fn settle(_p: Bytes) {}
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let running = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .subscriber_on::<MemoryBroker, _>(settle)
    ///     .start()
    ///     .await?;
    /// running.shutdown().await?;
    /// # Ok::<_, ruststream::Error>(()) }).unwrap();
    /// ```
    pub fn subscriber_on<T: Broker, M>(mut self, subscriber: impl IntoSubscriber<M>) -> Self {
        let broker = self
            .brokers
            .iter()
            .find_map(|b| b.as_any().downcast_ref::<T>())
            .cloned();
        match broker {
            Some(broker) => self.units.push(subscriber.into_unit(broker).0),
            None => self.mistakes.push(Error::Config(format!(
                "a subscriber is added on a `{}` broker, but the app has none: register it with `.broker(..)` first",
                std::any::type_name::<T>()
            ))),
        }
        self
    }

    /// The broker subscribers are currently added to.
    pub fn current_broker(&self) -> &B {
        &self.current
    }

    /// Subscribes every subscriber and starts their loops on the current Tokio
    /// runtime. When this returns, every subscription is open: messages
    /// published from now on are received.
    pub async fn start(self) -> Result<RunningApp> {
        if let Some(mistake) = self.mistakes.into_iter().next() {
            return Err(mistake);
        }
        #[cfg(feature = "prometheus")]
        if self.endpoints.is_some() {
            endpoints::prepare();
        }
        let app = AppHandle::new(
            &self.name,
            self.state,
            self.after_ack,
            &self.jobs,
            self.brokers.clone(),
            Outgoing::new(&self.name, self.on_publish),
        )?;
        RunningApp::start(Parts {
            brokers: self.brokers,
            units: self.units,
            layers: self.layers.into(),
            middleware: self.middleware.into(),
            hooks: self.hooks,
            app,
            shutdown_timeout: self.shutdown_timeout,
            endpoints: self.endpoints,
        })
        .await
    }

    /// Serves, from [`start`](Self::start) until the end of the shutdown,
    /// on `addr`: `/metrics` (every metric in the Prometheus text format;
    /// the first app to serve installs the process's recorder), `/health`
    /// (200 while the process answers) and `/ready` (200 once every
    /// subscription started, 503 from the moment the shutdown begins). An
    /// address that cannot be bound is a startup error. Port 0 picks a free
    /// port: [`RunningApp::metrics_addr`] tells which.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let running = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .serve_metrics(([127, 0, 0, 1], 0))
    ///     .start()
    ///     .await?;
    /// let addr = running.metrics_addr().unwrap();
    /// # let _ = addr;
    /// running.shutdown().await?;
    /// # Ok::<_, ruststream::Error>(()) }).unwrap();
    /// ```
    #[cfg(feature = "prometheus")]
    pub fn serve_metrics(mut self, addr: impl Into<std::net::SocketAddr>) -> Self {
        self.endpoints = Some(addr.into());
        self
    }

    /// Starts the app and runs it until SIGINT or SIGTERM (or a shutdown
    /// requested from inside, e.g. by a fail-fast subscriber), then shuts down
    /// in order. A second SIGINT/SIGTERM during the shutdown takes the
    /// timeout path at once.
    pub async fn run(self) -> Result<()> {
        let running = self.start().await?;
        tokio::select! {
            signal = signal::terminate() => {
                signal.map_err(|e| Error::App(e.into()))?;
                tracing::info!("shutdown signal received");
            }
            () = running.wait() => tracing::info!("shutdown requested by the app"),
        }
        running
            .shutdown_or_force(async {
                if signal::terminate().await.is_ok() {
                    tracing::warn!("second signal: forcing the shutdown timeout path");
                }
            })
            .await
    }
}
