//! The application: brokers, subscribers and the runtime that drives them.

mod handle;
mod register;
mod running;
mod signal;

use std::sync::Arc;

pub use handle::AppHandle;
pub use register::{BoundSubscriber, IntoSubscriber};
pub use running::RunningApp;

use self::register::{ErasedBroker, StartUnit};
use crate::accept::AcceptLayer;
use crate::binding::Broker;
use crate::{Error, Result};

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
}

impl App<NoBroker> {
    /// An empty app.
    pub fn new() -> Self {
        App {
            current: NoBroker,
            brokers: Vec::new(),
            units: Vec::new(),
            layers: Vec::new(),
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
    pub fn broker<N: Broker>(self, broker: N) -> App<N> {
        let mut brokers = self.brokers;
        brokers.push(Arc::new(broker.clone()));
        App {
            current: broker,
            brokers,
            units: self.units,
            layers: self.layers,
        }
    }

    /// Adds an accept layer run on every delivery of every subscriber, before
    /// decode, in the order added (RT-7).
    pub fn layer(mut self, layer: impl AcceptLayer) -> Self {
        self.layers.push(Arc::new(layer));
        self
    }
}

impl<B: Broker> App<B> {
    /// Adds a subscriber on the current broker: a `#[subscriber]` function, or
    /// any [`Subscriber`](crate::Subscriber) value.
    pub fn subscriber<M>(mut self, subscriber: impl IntoSubscriber<M>) -> Self {
        self.units
            .push(subscriber.into_unit(self.current.clone()).0);
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
        let layers: Arc<[Arc<dyn AcceptLayer>]> = self.layers.into();
        RunningApp::start(self.brokers, self.units, layers).await
    }

    /// Starts the app and runs it until SIGINT or SIGTERM, then shuts down
    /// gracefully: loops stop taking deliveries, deliveries in hand are settled,
    /// brokers close.
    pub async fn run(self) -> Result<()> {
        let running = self.start().await?;
        let signal = signal::terminate().await;
        tracing::info!("shutdown signal received");
        let stopped = running.shutdown().await;
        signal.map_err(|e| Error::App(e.into()))?;
        stopped
    }
}
