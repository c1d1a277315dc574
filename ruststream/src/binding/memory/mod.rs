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
//! * Each queue keeps one lane per publishing connection, with its own HWM
//!   budget, read in fair rounds (JQ-12): a flooding connection never starves
//!   the others ([`MemoryBroker::connect`], [`ReceiveRound`]).
//! * Request/reply sources ([`SubscribeOptions::receive_flow`]) expose a
//!   receive-flow switch: while paused, publishers wait as for a full queue
//!   (JQ-15); [`MemoryBroker::queues`] shows the state.
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
mod inbox;
mod queue;
mod readers;
mod registry;
mod route_cache;
mod shared;
mod subject;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::time::Instant;

pub use delivery::{LaneRequester, MemoryDelivery, MemorySubscription};

use self::inbox::Inbox;
use self::queue::{MemberFlow, Queue, Refused};
pub use self::queue::{QueueStats, ROUND_RECORDS, ReceiveRound};
use self::registry::{Registry, Targets};
use self::shared::BrokerShared;
use crate::binding::{Broker, Requester, SubscribeOptions};
use crate::text::{Part, TextArena};
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
pub(crate) struct Connection {
    /// The peer id its publishes are accounted under (JQ-24 item 9).
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
    inbox_prefix: String,
    inbox: Inbox,
    /// Single-lane reply queues by queue id (see [`MemorySubscription::requester`]).
    reply_lanes: Mutex<HashMap<u64, std::sync::Weak<Queue>>>,
    next_queue: AtomicU64,
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
    round: ReceiveRound,
    publish_timeout: Duration,
    max_publish_waiters: usize,
}

impl Default for MemoryBrokerBuilder {
    fn default() -> Self {
        MemoryBrokerBuilder {
            hwm: CoreHwm::default(),
            round: ReceiveRound::default(),
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

    /// Byte and time budgets of one fair receive round (JQ-12; default 1 MiB
    /// or 5 ms, whichever ends first, with at most 64 frames). A queue fed by
    /// several connections takes a round from one, then moves on to the next.
    pub fn receive_round(mut self, round: ReceiveRound) -> Self {
        self.round = round;
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
                id,
                generation: AtomicU64::new(0),
                shared: Arc::new(BrokerShared::new(
                    self.hwm.effective_memory_limit_bytes(),
                    self.max_publish_waiters,
                )),
                registry: RwLock::new(Registry::default()),
                budget: self.hwm.effective_budget_bytes(),
                round: self.round,
                publish_timeout: self.publish_timeout,
                inbox_prefix: format!("_INBOX.{id}."),
                inbox: Inbox::default(),
                reply_lanes: Mutex::new(HashMap::new()),
                next_queue: AtomicU64::new(1),
            }),
            conn: Connection::open(),
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
            conn: Connection::open(),
        }
    }

    fn ensure_open(&self) -> Result<()> {
        if self.conn.is_closed() {
            return Err(connection_closed());
        }
        Ok(())
    }

    /// Bytes all receive queues own right now (the Core's own observation;
    /// JQ-1).
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

    /// One publish. The common case is synchronous once the cooperative
    /// budget allows it: the route is looked up and every target queue admits
    /// the frame under the registry's read lock, with nothing cloned but the
    /// subject. Only a publish that must wait for space (JQ-19) leaves that
    /// path, for a boxed future that owns what it needs, so the waiting state
    /// never inflates the futures of publishes that do not wait.
    ///
    /// `conn` is the publishing connection, checked first (a closed one
    /// refuses); internal publishes (dead-lettering, requests) pass `None`.
    #[inline]
    pub(crate) fn publish<'a, 's>(
        &'a self,
        conn: Option<&'a Connection>,
        subject: &'s str,
        message: Message,
        deadline: Deadline,
    ) -> Publish<'a, 's> {
        Publish {
            inner: self,
            request: false,
            state: PublishState::Start {
                peer: conn.map_or(0, |conn| conn.id),
                conn,
                subject,
                message: Some(message),
                deadline,
            },
        }
    }

    /// Routes and admits `message` without waiting: `Stalled::Full` at the
    /// first target queue that has no room (the ones before it keep the
    /// frame, as with a waiting publish).
    /// `request`: a subject with no subscribers fails with `NoResponders`
    /// rather than dropping the message.
    fn publish_now(
        &self,
        peer: u64,
        subject: &str,
        message: Message,
        request: bool,
    ) -> Result<(), Stalled> {
        let generation = self.generation.load(Ordering::Acquire);
        if let Some(route) = route_cache::get(self.id, generation, subject) {
            // A queue that left since is skipped (see `route_cache`).
            return push_now(peer, &route.queues, &route.subject, message, true).map_err(|stall| {
                stall.into_stalled(peer, || Targets::Shared(Arc::clone(&route)), &route.subject)
            });
        }
        let registry = self.registry_read();
        let targets = match registry.exact(subject) {
            Ok(Some(route)) => {
                // Read under the lock: no change can come between.
                let generation = self.generation.load(Ordering::Acquire);
                route_cache::put(self.id, generation, route);
                return push_now(peer, &route.queues, &route.subject, message, false).map_err(
                    |stall| {
                        stall.into_stalled(
                            peer,
                            || Targets::Shared(Arc::clone(route)),
                            &route.subject,
                        )
                    },
                );
            }
            Ok(None) => None,
            Err(()) => registry.targets(subject),
        };
        drop(registry);
        let Some(targets) = targets else {
            if request {
                return Err(Stalled::Failed(Error::NoResponders(subject.to_owned())));
            }
            tracing::trace!(subject, "no subscribers; message dropped");
            return Ok(());
        };
        let subject = Text::from(subject);
        push_now(peer, targets.queues(), &subject, message, false)
            .map_err(|stall| stall.into_stalled(peer, || targets, &subject))
    }
    /// The single-lane queue a reply to `{prefix}L<queue>.<id>` goes to.
    fn reply_lane(&self, rest: &str) -> Option<Arc<Queue>> {
        let queue = rest.split('.').next()?.parse::<u64>().ok()?;
        self.reply_lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&queue)?
            .upgrade()
    }

    fn forget_reply_lane(&self, queue: u64) {
        self.reply_lanes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&queue);
    }

    /// A single-lane reply that reached the head of its queue: it completes
    /// its caller without a permit (JQ-24 item 6).
    pub(crate) fn complete_lane_reply(&self, env: Envelope) {
        let subject = env.subject().clone();
        let id = subject[self.inbox_prefix.len()..]
            .split('.')
            .nth(1)
            .unwrap_or("");
        self.complete(id, &subject, env.into_message());
    }

    /// Completion supply (JQ-6): a reply goes straight to its waiting caller.
    /// A reply for a request that already ended is dropped: first terminal wins.
    fn complete(&self, id: &str, subject: &str, message: Message) {
        let completed = inbox::parse_id(id).is_some_and(|id| self.inbox.complete(id, message));
        if !completed {
            crate::metrics::late_reply("memory");
            tracing::debug!(subject, "late or unknown reply dropped");
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

/// The future of one publish ([`Inner::publish`]): a hand-written state
/// machine, so the path that does not wait is one plain function call per
/// poll rather than nested `async` state.
pub(crate) struct Publish<'a, 's> {
    inner: &'a Inner,
    /// A request: no subscribers is `NoResponders`, and an inbox subject is
    /// no reply.
    request: bool,
    state: PublishState<'a, 's>,
}

impl Publish<'_, '_> {
    /// Makes this the publish of a request (see [`Publish::request`]): the
    /// route lookup that admits it also finds whether anyone responds.
    fn request(mut self) -> Self {
        self.request = true;
        self
    }
}

enum PublishState<'a, 's> {
    /// Not admitted yet; `conn` is `None` once checked, `message` once
    /// handed on (the publish is then finished or waiting).
    Start {
        /// The publishing connection's id, kept across polls.
        peer: u64,
        conn: Option<&'a Connection>,
        subject: &'s str,
        message: Option<Message>,
        deadline: Deadline,
    },
    /// Waiting for space (JQ-19), out of line.
    Waiting(Pin<Box<dyn Future<Output = Result<()>> + Send>>),
    Done,
}

impl Future for Publish<'_, '_> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = &mut *self;
        let inner = this.inner;
        match &mut this.state {
            PublishState::Start {
                peer,
                conn,
                subject,
                message,
                deadline,
            } => {
                let (peer, subject) = (*peer, *subject);
                if let Some(conn) = conn.take()
                    && conn.is_closed()
                {
                    this.state = PublishState::Done;
                    return Poll::Ready(Err(connection_closed()));
                }
                // Inbox subjects start with `_`: one byte compare on every
                // publish, the whole prefix only for candidates.
                if subject.as_bytes().first() == Some(&b'_')
                    && !this.request
                    && subject.starts_with(inner.inbox_prefix.as_str())
                {
                    let message = take_message(message);
                    let rest = &subject[inner.inbox_prefix.len()..];
                    let Some(lane) = rest.strip_prefix('L') else {
                        // Two-lane: the completion lane, straight to the caller.
                        inner.complete(rest, subject, message);
                        return Poll::Ready(Ok(()));
                    };
                    // Single-lane: the reply queues in the requester's own
                    // FIFO, under its HWM and pause like any frame.
                    let Some(queue) = inner.reply_lane(lane) else {
                        crate::metrics::late_reply("memory");
                        return Poll::Ready(Ok(()));
                    };
                    let subject = Text::from(subject);
                    match push_now(peer, std::slice::from_ref(&queue), &subject, message, false) {
                        Ok(()) => return Poll::Ready(Ok(())),
                        Err(stall) => {
                            match stall.into_stalled(peer, || Targets::Owned(vec![queue]), &subject)
                            {
                                Stalled::Failed(err) => return Poll::Ready(Err(err)),
                                Stalled::Full(waiting) => {
                                    let deadline = *deadline;
                                    this.state =
                                        PublishState::Waiting(Box::pin(waiting.wait(deadline)));
                                }
                            }
                        }
                    }
                } else {
                    // Cooperative budget: a publisher that never has to wait
                    // still lets the other tasks of its runtime run.
                    ready!(crate::coop::poll_publish(cx));
                    let message = take_message(message);
                    match inner.publish_now(peer, subject, message, this.request) {
                        Ok(()) => return Poll::Ready(Ok(())),
                        Err(Stalled::Failed(err)) => return Poll::Ready(Err(err)),
                        Err(Stalled::Full(waiting)) => {
                            let deadline = *deadline;
                            this.state = PublishState::Waiting(Box::pin(waiting.wait(deadline)));
                        }
                    }
                }
            }
            PublishState::Waiting(_) => {}
            PublishState::Done => panic!("publish future polled after completion"),
        }
        let PublishState::Waiting(waiting) = &mut this.state else {
            unreachable!("only a waiting publish gets here")
        };
        let result = ready!(waiting.as_mut().poll(cx));
        this.state = PublishState::Done;
        Poll::Ready(result)
    }
}

/// The message of a publish in its start state: taken once, where a
/// whole-state swap would move every field.
#[inline]
fn take_message(message: &mut Option<Message>) -> Message {
    match message.take() {
        Some(message) => message,
        None => panic!("publish future polled after completion"),
    }
}

/// Why a publish could not finish without waiting.
enum Stalled {
    /// It failed for good (a target queue is closed).
    Failed(Error),
    /// A target queue is full: wait for space there, then go on.
    Full(Box<Waiting>),
}

/// A publish that has to wait for space in `targets[at]`; the queues before
/// `at` already admitted the frame.
struct Waiting {
    peer: u64,
    targets: Targets,
    subject: Text,
    at: usize,
    env: Envelope,
    /// The message for the queues after `at`, if any.
    rest: Option<Message>,
}

impl Waiting {
    /// JQ-19: wait for space until the deadline, submit once, then publish to
    /// the remaining queues as usual.
    async fn wait(self, deadline: Deadline) -> Result<()> {
        let queues = self.targets.queues();
        queues[self.at]
            .wait_push(self.peer, self.env, || deadline.resolve())
            .await?;
        match self.rest {
            Some(message) => {
                fan_out(
                    self.peer,
                    &queues[self.at + 1..],
                    &self.subject,
                    message,
                    deadline,
                )
                .await
            }
            None => Ok(()),
        }
    }
}

/// How `push_now` stopped.
enum PushStall {
    Closed,
    Full {
        at: usize,
        env: Envelope,
        rest: Option<Message>,
    },
}

impl PushStall {
    fn into_stalled(self, peer: u64, targets: impl FnOnce() -> Targets, subject: &Text) -> Stalled {
        match self {
            PushStall::Closed => Stalled::Failed(queue_closed()),
            PushStall::Full { at, env, rest } => Stalled::Full(Box::new(Waiting {
                peer,
                targets: targets(),
                subject: subject.clone(),
                at,
                env,
                rest,
            })),
        }
    }
}

/// Offers the frame to every queue in order without waiting, stopping at
/// the first one that refuses it. With `skip_closed`, a closed queue (one
/// that left the route since it was cached) is passed over.
// The refused frame comes back by value: boxing it would allocate on the path
// that is already under pressure.
#[allow(clippy::result_large_err)]
fn push_now(
    peer: u64,
    queues: &[Arc<Queue>],
    subject: &Text,
    message: Message,
    skip_closed: bool,
) -> Result<(), PushStall> {
    let Some((last, rest)) = queues.split_last() else {
        return Ok(());
    };
    for (at, queue) in rest.iter().enumerate() {
        match queue.try_push(peer, Envelope::new(subject.clone(), message.clone())) {
            Ok(()) => {}
            Err(Refused::Closed) if skip_closed => {}
            Err(Refused::Closed) => return Err(PushStall::Closed),
            Err(Refused::Full(env)) => {
                return Err(PushStall::Full {
                    at,
                    env,
                    rest: Some(message),
                });
            }
        }
    }
    match last.try_push(peer, Envelope::new(subject.clone(), message)) {
        Ok(()) => Ok(()),
        Err(Refused::Closed) if skip_closed => Ok(()),
        Err(Refused::Closed) => Err(PushStall::Closed),
        Err(Refused::Full(env)) => Err(PushStall::Full {
            at: rest.len(),
            env,
            rest: None,
        }),
    }
}

/// One publish to every target queue. Each queue is independent, as
/// subscriptions are on NATS: a queue that stays full until the deadline fails
/// the publish, and queues that already admitted the message keep it.
async fn fan_out(
    peer: u64,
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
            .push(
                peer,
                Envelope::new(subject.clone(), message.clone()),
                || deadline.resolve(),
            )
            .await?;
    }
    last.push(peer, Envelope::new(subject.clone(), message), || {
        deadline.resolve()
    })
    .await
}

fn connection_closed() -> Error {
    Error::Closed("memory broker connection is closed")
}

fn queue_closed() -> Error {
    Error::Closed("subscription closed")
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
                    self.inner.next_queue.fetch_add(1, Ordering::Relaxed),
                    Text::from(format!("{}L", self.inner.inbox_prefix)),
                    options.subject.clone(),
                    options.queue_group.clone(),
                    options.dead_letter.clone(),
                    self.inner.budget,
                    self.inner.round,
                    Arc::clone(&self.inner.shared),
                    Arc::downgrade(&self.inner),
                ));
                registry.insert(Arc::clone(&queue), options.queue_group.clone());
                queue
            }
        };
        queue.join();
        let flow = options
            .receive_flow
            .then(|| Arc::new(MemberFlow::new(Arc::clone(&queue))));
        Ok(MemorySubscription {
            flow,
            queue,
            broker: Arc::downgrade(&self.inner),
            conn: Arc::clone(&self.conn),
        })
    }

    // Not an `async fn`: the publish future itself, with no wrapper around it.
    #[inline]
    fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<()>> + Send {
        let deadline = match deadline {
            Some(at) => Deadline::At(at),
            None => Deadline::After(self.inner.publish_timeout),
        };
        self.inner
            .publish(Some(&self.conn), subject, message, deadline)
    }

    /// Closes this connection: its subscriptions end (their queues keep
    /// serving other connections' members), and its publishes fail with
    /// `Closed`. Other connections to the same server are not affected.
    async fn close(&self) -> Result<()> {
        if !self.conn.closed.swap(true, Ordering::AcqRel) {
            // Consumers wait on their queue alone: wake them all to look at
            // their connection (other connections' go back to waiting).
            for queue in self.inner.registry_read().queues() {
                queue.wake_readers();
            }
        }
        Ok(())
    }
}

/// `future`'s output if it is ready now or once this task has yielded to
/// the others once; `None` if it is still pending then. A reply from a
/// handler on the same runtime usually comes back within that one yield, and
/// then the request never arms (and clears) a timer of its own: the timer
/// was most of a round trip's cost.
async fn after_one_yield<F: Future>(mut future: Pin<&mut F>) -> Option<F::Output> {
    let mut yielded = false;
    std::future::poll_fn(|cx| match future.as_mut().poll(cx) {
        Poll::Ready(output) => Poll::Ready(Some(output)),
        Poll::Pending if !yielded => {
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

/// Releases a request's inbox slot however the request ends.
struct InboxGuard<'a> {
    inner: &'a Inner,
    id: u64,
}

impl Drop for InboxGuard<'_> {
    fn drop(&mut self) {
        self.inner.inbox.close(self.id);
    }
}

/// `{prefix}{id}`, or `{prefix}L{queue}.{id}` for a single-lane reply: cut
/// from the inbox's subject arena, shared by the request and the inbox slot.
fn inbox_subject(arena: &mut TextArena, prefix: &str, lane: Option<u64>, id: u64) -> Text {
    let [slot, dash, generation] = inbox::id_parts(id);
    match lane {
        None => arena.concat(&[Part::Str(prefix), slot, dash, generation]),
        Some(queue) => arena.concat(&[
            Part::Str(prefix),
            Part::Str("L"),
            Part::Decimal(queue),
            Part::Str("."),
            slot,
            dash,
            generation,
        ]),
    }
}

impl Requester for MemoryBroker {
    fn send_request(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> impl Future<Output = Result<Envelope>> + Send {
        self.request_via(None, subject, message, timeout)
    }
}

impl MemoryBroker {
    /// One request. `lane` is the single-lane queue its reply must come back
    /// through; `None` is the two-lane completion path (JQ-6).
    async fn request_via(
        &self,
        lane: Option<u64>,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        let inner = &*self.inner;
        self.ensure_open()?;
        let deadline = Instant::now() + timeout;
        let (id, reply_to) = inner
            .inbox
            .open(|arena, id| inbox_subject(arena, &inner.inbox_prefix, lane, id));
        let _guard = InboxGuard { inner, id };
        inner
            .publish(
                Some(&self.conn),
                subject,
                message.with_reply_to(reply_to),
                Deadline::At(deadline),
            )
            .request()
            .await?;
        let mut reply = std::pin::pin!(std::future::poll_fn(|cx| inner.inbox.poll_reply(id, cx)));
        if let Some(reply) = after_one_yield(reply.as_mut()).await {
            return Ok(reply);
        }
        tokio::time::timeout_at(deadline, reply)
            .await
            .map_err(|_| Error::Timeout(timeout))
    }
}

impl LaneRequester {
    /// Sends a request whose reply comes back through the subscription's own
    /// receive FIFO (single-lane). The reply waits behind frames queued
    /// before it and under the queue's HWM and pause; once it reaches the head
    /// it completes this call without a job permit. A reply that arrives
    /// after `timeout` is dropped: the first terminal result wins. A reply
    /// that reports a failure is an error, as in
    /// [`Requester::request_message`](crate::Requester::request_message).
    pub async fn request_message(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        let Some(broker) = &self.broker else {
            return Err(connection_closed());
        };
        let reply = broker
            .request_via(Some(self.lane), subject, message, timeout)
            .await?;
        crate::reply_result(reply)
    }
}
