//! # ruststream
//!
//! Message-driven services on brokers. Write plain `async fn` handlers, mark
//! them [`#[subscriber]`](macro@subscriber), register them on an [`App`], and
//! get a production runtime: bounded memory, backpressure, redelivery with a
//! retry budget, dead-lettering, request/reply and a graceful stop.
//!
//! ```
//! use ruststream::prelude::*;
//!
//! #[derive(Serialize, Deserialize)]
//! struct Order { id: u64, qty: u32 }
//!
//! #[derive(Serialize, Deserialize, PartialEq, Debug)]
//! struct Confirmed { id: u64 }
//!
//! /// One delivery at a time, in order; the return value is the reply.
//! #[subscriber("orders.created")]
//! async fn confirm(order: Order) -> Result<Confirmed, HandlerError> {
//!     Ok(Confirmed { id: order.id })
//! }
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let broker = MemoryBroker::new();
//! let running = App::new().broker(broker.clone()).subscriber(confirm).start().await?;
//! let reply: Confirmed = Publisher::new(broker)
//!     .request("orders.created", &Order { id: 7, qty: 1 }, std::time::Duration::from_secs(1))
//!     .await?;
//! assert_eq!(reply, Confirmed { id: 7 });
//! running.shutdown().await?;
//! # Ok::<_, ruststream::Error>(()) }).unwrap();
//! ```
//!
//! The user guide (the `book/` folder of the repository) explains every
//! feature with tested examples; its "Guarantees" chapter lists what the
//! runtime promises and the test that checks each promise.
#![deny(missing_docs)]

mod accept;
mod app;
#[cfg(feature = "asyncapi")]
pub mod asyncapi;
pub mod binding;
#[cfg(feature = "cli")]
pub mod cli;
pub mod codec;
mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
mod coop;
mod ctx;
mod describe;
mod error;
mod exec;
pub mod extract;
mod host;
pub mod ingress;
mod key;
mod launch;
mod message;
mod meta_box;
pub mod metrics;
pub mod middleware;
mod outcome;
mod outgoing;
mod pipeline;
mod publisher;
mod reply_port;
#[cfg(feature = "config")]
pub mod settings;
mod spans;
pub mod subscriber;
mod sync;
mod tasks;
#[cfg(feature = "testing")]
pub mod testing;
mod text;
#[cfg(feature = "opentelemetry")]
mod trace_context;
mod waiters;

#[cfg(all(test, loom))]
mod loom_models;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

pub use accept::{AcceptLayer, Verdict};
pub use app::{App, BoundSubscriber, Configure, Configured, IntoSubscriber, NoBroker, RunningApp};
/// The Kafka binding (feature `kafka`).
#[cfg(feature = "kafka")]
pub use binding::kafka;
pub use binding::memory::MemoryBroker;
/// The MQTT binding (feature `mqtt`).
#[cfg(feature = "mqtt")]
pub use binding::mqtt;
/// The NATS binding (feature `nats`).
#[cfg(feature = "nats")]
pub use binding::nats;
/// The RabbitMQ binding (feature `rabbitmq`).
#[cfg(feature = "rabbitmq")]
pub use binding::rabbitmq;
/// The Redis Streams binding (feature `redis`).
#[cfg(feature = "redis")]
pub use binding::redis;
pub use binding::{Broker, Delivery, Requester, SubscribeOptions, Subscription};
pub use codec::{Codec, Json};
pub use ctx::{Ctx, CtxRuntime, Here, MainRuntime};
pub use error::{BoxError, Error, HandlerError, Result};
pub use host::AppHandle;
pub use message::{Envelope, Headers, Message, header};
pub use publisher::Publisher;
pub use subscriber::State;
pub use text::Text;

pub use ruststream_macros::{app, subscriber};

/// Everything a typical service needs, in one import.
pub mod prelude {
    pub use crate::{
        App, Broker, Configure, Ctx, Delivery, HandlerError, MainRuntime, MemoryBroker, Message,
        Publisher, Requester, RunningApp, State, Subscription, subscriber,
    };
    pub use bytes::Bytes;
    pub use serde::{Deserialize, Serialize};
}

/// The book's and the README's examples, compiled and run as doc tests.
#[cfg(doctest)]
mod book {
    #[doc = include_str!("../../README.md")]
    mod readme {}
    #[doc = include_str!("../../book/src/subscribers.md")]
    mod subscribers {}
    #[doc = include_str!("../../book/src/app.md")]
    mod app {}
    #[doc = include_str!("../../book/src/memory-broker.md")]
    mod memory_broker {}
    #[doc = include_str!("../../book/src/execution-modes.md")]
    mod execution_modes {}
    #[doc = include_str!("../../book/src/batch.md")]
    mod batch {}
    #[doc = include_str!("../../book/src/job-queue.md")]
    mod job_queue {}
    #[doc = include_str!("../../book/src/publishing.md")]
    mod publishing {}
    #[doc = include_str!("../../book/src/request-reply.md")]
    mod request_reply {}
    #[cfg(all(feature = "msgpack", feature = "protobuf"))]
    #[doc = include_str!("../../book/src/codecs.md")]
    mod codecs {}
    #[cfg(feature = "testing")]
    #[doc = include_str!("../../book/src/testing.md")]
    mod testing {}
    #[cfg(all(feature = "prometheus", feature = "opentelemetry"))]
    #[doc = include_str!("../../book/src/observability.md")]
    mod observability {}
    #[cfg(all(feature = "cli", feature = "nats"))]
    #[doc = include_str!("../../book/src/configuration.md")]
    mod configuration {}
    #[cfg(feature = "asyncapi")]
    #[doc = include_str!("../../book/src/asyncapi.md")]
    mod asyncapi {}
    #[doc = include_str!("../../book/src/middleware.md")]
    mod middleware {}
    #[cfg(feature = "nats")]
    #[doc = include_str!("../../book/src/nats.md")]
    mod nats {}
    #[cfg(feature = "redis")]
    #[doc = include_str!("../../book/src/redis.md")]
    mod redis {}
    #[cfg(feature = "rabbitmq")]
    #[doc = include_str!("../../book/src/rabbitmq.md")]
    mod rabbitmq {}
    #[cfg(feature = "kafka")]
    #[doc = include_str!("../../book/src/kafka.md")]
    mod kafka {}
    #[cfg(feature = "mqtt")]
    #[doc = include_str!("../../book/src/mqtt.md")]
    mod mqtt {}
    #[cfg(all(feature = "nats", feature = "redis", feature = "rabbitmq"))]
    #[doc = include_str!("../../book/src/failures.md")]
    mod failures {}
}

/// Re-exported for the prelude's derives and for users' convenience.
pub use bytes;
pub use serde;
pub use serde_json;
