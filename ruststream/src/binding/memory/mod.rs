//! The embedded memory Core: the default broker for quick starts, tests and
//! single-process services.
//!
//! * Subjects with NATS-style wildcards (`*`, `>`).
//! * Fan-out: every subscription gets every message, unless subscriptions share
//!   a queue group, in which case they compete for one shared queue.
//! * Each receive queue is bounded by a byte high-water mark
//!   ([`CoreHwm`], JQ-1/JQ-3); a publish into a full queue waits for space until
//!   its deadline, then fails with [`Error::DeadlineExceeded`] (JQ-19). Waiter
//!   slots are bounded; nothing is dropped to make room, nothing polls.
//! * `nack` (and dropping a delivery unsettled) redelivers with attempt + 1;
//!   `reject` goes to the subscription's dead-letter subject, else is dropped
//!   with a warning.
//! * Request/reply: replies complete the caller directly, bypassing every
//!   queue (JQ-6).
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

mod delivery;
mod queue;
mod registry;
mod shared;
mod subject;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

pub use delivery::{MemoryDelivery, MemorySubscription};

use self::queue::Queue;
use self::registry::{Registry, Targets};
use self::shared::BrokerShared;
use crate::binding::{Broker, Requester, SubscribeOptions};
use crate::{CoreHwm, Envelope, Error, Message, Result, Text};

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
#[derive(Default)]
pub(crate) struct Connection {
    closed: AtomicBool,
    on_close: tokio::sync::Notify,
}

impl Connection {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Resolves once the connection is closed.
    pub(crate) async fn closed(&self) {
        loop {
            let mut notified = std::pin::pin!(self.on_close.notified());
            notified.as_mut().enable();
            if self.is_closed() {
                return;
            }
            notified.await;
        }
    }
}

pub(crate) struct Inner {
    shared: Arc<BrokerShared>,
    registry: RwLock<Registry>,
    budget: usize,
    publish_timeout: Duration,
    inbox_prefix: String,
    next_inbox: AtomicU64,
    inbox: Mutex<HashMap<u64, oneshot::Sender<Envelope>>>,
}

/// Settings for a [`MemoryBroker`].
///
/// ```
/// use std::time::Duration;
/// use ruststream::{CoreHwm, CoreHwmProfile, MemoryBroker};
///
/// let broker = MemoryBroker::builder()
///     .hwm(CoreHwm::profile(CoreHwmProfile::Small).budget_bytes(256 * 1024))
///     .publish_timeout(Duration::from_secs(2))
///     .max_publish_waiters(128)
///     .build();
/// # drop(broker);
/// ```
#[derive(Clone, Debug)]
pub struct MemoryBrokerBuilder {
    hwm: CoreHwm,
    publish_timeout: Duration,
    max_publish_waiters: usize,
}

impl Default for MemoryBrokerBuilder {
    fn default() -> Self {
        MemoryBrokerBuilder {
            hwm: CoreHwm::default(),
            publish_timeout: Duration::from_secs(10),
            max_publish_waiters: 1024,
        }
    }
}

impl MemoryBrokerBuilder {
    /// Core HWM settings (default: `CoreHwmProfile::Balanced`).
    pub fn hwm(mut self, hwm: CoreHwm) -> Self {
        self.hwm = hwm;
        self
    }

    /// Deadline of a publish that passes none (default 10 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// How many publishes may wait for queue space at once (default 1024);
    /// one more fails at once with `DeadlineExceeded` (JQ-19).
    pub fn max_publish_waiters(mut self, n: usize) -> Self {
        self.max_publish_waiters = n;
        self
    }

    /// The broker.
    pub fn build(self) -> MemoryBroker {
        let id = NEXT_BROKER_ID.fetch_add(1, Ordering::Relaxed);
        MemoryBroker {
            inner: Arc::new(Inner {
                shared: Arc::new(BrokerShared::new(
                    self.hwm.effective_memory_limit_bytes(),
                    self.max_publish_waiters,
                )),
                registry: RwLock::new(Registry::default()),
                budget: self.hwm.effective_budget_bytes(),
                publish_timeout: self.publish_timeout,
                inbox_prefix: format!("_INBOX.{id}."),
                next_inbox: AtomicU64::new(1),
                inbox: Mutex::new(HashMap::new()),
            }),
            conn: Arc::default(),
        }
    }
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
            conn: Arc::default(),
        }
    }

    fn ensure_open(&self) -> Result<()> {
        if self.conn.is_closed() {
            return Err(Error::Closed("memory broker connection is closed"));
        }
        Ok(())
    }

    /// Bytes all receive queues own right now (the Core's own observation;
    /// JQ-1).
    pub fn queued_bytes(&self) -> usize {
        self.inner.shared.bytes()
    }
}

impl Inner {
    pub(crate) fn registry_write(&self) -> RwLockWriteGuard<'_, Registry> {
        self.registry.write().unwrap_or_else(|e| e.into_inner())
    }

    fn registry_read(&self) -> RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) async fn publish(
        &self,
        subject: &str,
        message: Message,
        deadline: Deadline,
    ) -> Result<()> {
        if let Some(id) = subject.strip_prefix(self.inbox_prefix.as_str()) {
            self.complete(id, subject, message);
            return Ok(());
        }
        let targets = self.registry_read().targets(subject);
        match targets {
            None => {
                tracing::trace!(subject, "no subscribers; message dropped");
                Ok(())
            }
            Some(Targets::Shared(route)) => {
                fan_out(&route.queues, &route.subject, message, deadline).await
            }
            Some(Targets::Owned(queues)) => {
                fan_out(&queues, &Text::from(subject), message, deadline).await
            }
        }
    }

    /// Completion supply (JQ-6): a reply goes straight to its waiting caller.
    /// A reply for a request that already ended is dropped: first terminal wins.
    fn complete(&self, id: &str, subject: &str, message: Message) {
        let waiter = id.parse::<u64>().ok().and_then(|id| {
            self.inbox
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&id)
        });
        match waiter {
            Some(tx) => {
                let _ = tx.send(Envelope::new(Text::from(subject), message));
            }
            None => tracing::debug!(subject, "late or unknown reply dropped"),
        }
    }
}

/// When a waiting publish gives up.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Deadline {
    /// At this instant.
    At(Instant),
    /// This long after it starts waiting: the clock is read only when a
    /// publish has to wait, never on the fast path.
    After(Duration),
}

impl Deadline {
    fn resolve(self) -> Instant {
        match self {
            Deadline::At(at) => at,
            Deadline::After(wait) => Instant::now() + wait,
        }
    }
}

/// One publish to every target queue. Each queue is independent, as
/// subscriptions are on NATS: a queue that stays full until the deadline fails
/// the publish, and queues that already admitted the message keep it.
async fn fan_out(
    queues: &[Arc<Queue>],
    subject: &Text,
    message: Message,
    deadline: Deadline,
) -> Result<()> {
    let Some((last, rest)) = queues.split_last() else {
        return Ok(());
    };
    for queue in rest {
        queue
            .push(Envelope::new(subject.clone(), message.clone()), || {
                deadline.resolve()
            })
            .await?;
    }
    last.push(Envelope::new(subject.clone(), message), || {
        deadline.resolve()
    })
    .await
}

impl Broker for MemoryBroker {
    type Subscription = MemorySubscription;

    fn name(&self) -> &'static str {
        "memory"
    }

    async fn subscribe(&self, options: SubscribeOptions) -> Result<MemorySubscription> {
        self.ensure_open()?;
        let mut registry = self.inner.registry_write();
        let existing = options
            .queue_group
            .as_ref()
            .and_then(|g| registry.group(&options.subject, g));
        let queue = match existing {
            Some(queue) => queue,
            None => {
                let queue = Arc::new(Queue::new(
                    options.subject.clone(),
                    options.dead_letter.clone(),
                    self.inner.budget,
                    Arc::clone(&self.inner.shared),
                    Arc::downgrade(&self.inner),
                ));
                registry.insert(Arc::clone(&queue), options.queue_group.clone());
                queue
            }
        };
        queue.join();
        Ok(MemorySubscription {
            queue,
            broker: Arc::downgrade(&self.inner),
            conn: Arc::clone(&self.conn),
        })
    }

    async fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.ensure_open()?;
        let deadline = match deadline {
            Some(at) => Deadline::At(at),
            None => Deadline::After(self.inner.publish_timeout),
        };
        self.inner.publish(subject, message, deadline).await
    }

    /// Closes this connection: its subscriptions end (their queues keep
    /// serving other connections' members), and its publishes fail with
    /// `Closed`. Other connections to the same server are not affected.
    async fn close(&self) -> Result<()> {
        if !self.conn.closed.swap(true, Ordering::AcqRel) {
            self.conn.on_close.notify_waiters();
        }
        Ok(())
    }
}

/// Removes a request's inbox entry however the request ends.
struct InboxGuard<'a> {
    inner: &'a Inner,
    id: u64,
}

impl Drop for InboxGuard<'_> {
    fn drop(&mut self) {
        self.inner
            .inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

impl Requester for MemoryBroker {
    async fn request_message(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        let inner = &*self.inner;
        self.ensure_open()?;
        if inner.registry_read().targets(subject).is_none() {
            return Err(Error::NoResponders(subject.to_owned()));
        }
        let deadline = Instant::now() + timeout;
        let id = inner.next_inbox.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        inner
            .inbox
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, tx);
        let _guard = InboxGuard { inner, id };
        let reply_to = format!("{}{id}", inner.inbox_prefix);
        inner
            .publish(
                subject,
                message.with_reply_to(reply_to),
                Deadline::At(deadline),
            )
            .await?;
        match tokio::time::timeout_at(deadline, rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(Error::Closed("memory broker closed before the reply")),
            Err(_) => Err(Error::Timeout(timeout)),
        }
    }
}
