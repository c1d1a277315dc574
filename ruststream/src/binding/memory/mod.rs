//! The embedded memory Core: the default broker for quick starts, tests and
//! single-process services.
//!
//! * Subjects with NATS-style wildcards (`*`, `>`).
//! * Fan-out: every subscription gets every message, unless subscriptions share
//!   a queue group, in which case they compete for one shared queue.
//! * Each receive queue is bounded by a byte high-water mark
//!   ([`CoreHwm`]); a publish into a full queue waits for space until
//!   its deadline, then fails with [`Error::DeadlineExceeded`]. Waiter
//!   slots are bounded; nothing is dropped to make room, nothing polls. A
//!   request does not wait (JQ-19): a full queue refuses it at once with
//!   the same error. With several subscriptions, a full queue never holds
//!   up the others, and a publish that any queue took succeeds.
//! * Each queue keeps one lane per publishing connection, with its own HWM
//!   budget, read in fair rounds: a flooding connection never starves
//!   the others ([`MemoryBroker::connect`], [`ReceiveRound`]).
//! * Request/reply sources ([`SubscribeOptions::receive_flow`](crate::SubscribeOptions::receive_flow)) expose a
//!   receive-flow switch: while paused, publishers wait and requests are
//!   refused, as for a full queue; [`MemoryBroker::queues`] shows the state.
//! * `nack` (and dropping a delivery unsettled) redelivers with attempt + 1;
//!   `reject` goes to the subscription's dead-letter subject, else is dropped
//!   with a warning.
//! * Request/reply: replies complete the caller directly, bypassing every
//!   queue.
//!
//! ```
//! use ruststream::{Broker, Delivery, MemoryBroker, Message, SubscribeOptions, Subscription};
//!
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! let broker = MemoryBroker::new();
//! let mut sub = broker.subscribe(SubscribeOptions::new("greetings")).await?;
//! broker.publish_message("greetings", Message::new("hi"), None).await?;
//! let delivery = sub.next().await.expect("open");
//! assert_eq!(delivery.envelope().payload(), "hi".as_bytes());
//! delivery.ack().await?;
//! # Ok::<_, ruststream::Error>(()) }).unwrap();
//! ```

mod broker;
mod builder;
mod delivery;
mod inbox;
mod lanes;
mod member_flow;
mod publish;
mod queue;
mod queue_state;
mod registry;
mod replies;
mod route_cache;
mod shared;
mod stats;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

pub use self::lanes::{ROUND_RECORDS, ReceiveRound};
pub use self::stats::QueueStats;
pub use crate::config::{CoreHwm, CoreHwmProfile};
pub use crate::message::FRAME_OVERHEAD;
pub use builder::MemoryBrokerBuilder;
pub use delivery::{LaneRequester, MemoryDelivery, MemorySubscription};
pub(crate) use publish::Deadline;

use self::inbox::Inbox;
use self::queue::Queue;
use self::registry::Registry;
use self::shared::BrokerShared;
use crate::{Error, Result};

static NEXT_BROKER_ID: AtomicU64 = AtomicU64::new(1);

/// The embedded in-process broker: a server and a connection to it in one
/// value. Clones share the connection; [`connect`](MemoryBroker::connect)
/// opens another connection to the same server, which closes on its own —
/// like two processes on one NATS server.
#[derive(Clone)]
pub struct MemoryBroker {
    inner: Arc<Inner>,
    conn: Arc<Connection>,
}

/// One connection's state: closing it ends its subscriptions and refuses its
/// publishes, and leaves other connections running.
pub(crate) struct Connection {
    /// The peer id its publishes are accounted under.
    id: u64,
    closed: AtomicBool,
}

static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

impl Connection {
    fn open() -> Arc<Connection> {
        Arc::new(Connection {
            id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
            closed: AtomicBool::new(false),
        })
    }

    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

pub(crate) struct Inner {
    /// Unique per broker, for the per-thread route cache.
    id: u64,
    shared: Arc<BrokerShared>,
    registry: RwLock<Registry>,
    /// Bumped by every registry change, under its write lock: cached routes
    /// from an older generation are stale ([`route_cache`]).
    generation: AtomicU64,
    budget: usize,
    round: ReceiveRound,
    publish_timeout: Duration,
    inbox: Inbox,
    /// Single-lane reply queues by queue id (see [`MemorySubscription::requester`]).
    reply_lanes: Mutex<HashMap<u64, std::sync::Weak<Queue>>>,
    next_queue: AtomicU64,
}

impl Default for MemoryBroker {
    fn default() -> Self {
        MemoryBroker::new()
    }
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker")
            .field("queued_bytes", &self.queued_bytes())
            .finish_non_exhaustive()
    }
}

impl MemoryBroker {
    /// A broker with default settings.
    pub fn new() -> Self {
        MemoryBrokerBuilder::default().build()
    }

    /// Settings for a new broker.
    pub fn builder() -> MemoryBrokerBuilder {
        MemoryBrokerBuilder::default()
    }

    /// A new connection to the same in-process server. Closing it ends only
    /// its own subscriptions: unsettled deliveries go back to their queues for
    /// the other consumers.
    pub fn connect(&self) -> MemoryBroker {
        MemoryBroker {
            inner: Arc::clone(&self.inner),
            conn: Connection::open(),
        }
    }

    fn ensure_open(&self) -> Result<()> {
        if self.conn.is_closed() {
            return Err(connection_closed());
        }
        Ok(())
    }

    /// Bytes all receive queues own right now (the broker's own
    /// observation).
    pub fn queued_bytes(&self) -> usize {
        self.inner.shared.bytes()
    }

    /// Every receive queue of the server, as it is now: what is waiting in
    /// it, for how many peers, and whether its receive flow is paused.
    ///
    /// ```
    /// use ruststream::{Broker, MemoryBroker, Message, SubscribeOptions};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let broker = MemoryBroker::new();
    /// let _sub = broker.subscribe(SubscribeOptions::new("jobs").queue_group("w")).await?;
    /// broker.publish_message("jobs", Message::new("one"), None).await?;
    /// let queues = broker.queues();
    /// assert_eq!(queues[0].queued, 1);
    /// assert!(!queues[0].receive_paused);
    /// # Ok::<_, ruststream::Error>(()) }).unwrap();
    /// ```
    pub fn queues(&self) -> Vec<QueueStats> {
        self.inner
            .registry_read()
            .queues()
            .map(|q| q.stats())
            .collect()
    }
}

impl Inner {
    /// The registry, to change it: cached routes go stale.
    pub(crate) fn registry_write(&self) -> RwLockWriteGuard<'_, Registry> {
        let registry = self.registry.write().unwrap_or_else(|e| e.into_inner());
        self.generation.fetch_add(1, Ordering::Release);
        registry
    }

    fn registry_read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }
}

fn connection_closed() -> Error {
    Error::Closed("memory broker connection is closed")
}

fn queue_closed() -> Error {
    Error::Closed("subscription closed")
}
