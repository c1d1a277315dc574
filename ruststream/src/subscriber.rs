//! Subscribers written by hand: the [`Subscriber`] trait that
//! `#[subscriber]` implements for you, its [`SubscriberConfig`], and what a
//! handler invocation sees ([`Scope`], [`Outcome`]). Reach for these to
//! build subscribers at run time; annotated functions need none of it.

use std::any::TypeId;
use std::future::Future;

use bytes::Bytes;

use std::sync::{Arc, OnceLock};

use crate::binding::erased::ErasedBroker;
use crate::ctx::CtxRuntime;
use crate::host::AppHandle;
use crate::middleware::{Middleware, SharedMiddleware};
use crate::tasks::FollowUps;
use crate::{BoxError, Codec, Ctx, Envelope, Text};

pub use crate::describe::MessageTypes;
#[cfg(feature = "asyncapi")]
pub use crate::describe::SchemaFn;
pub use crate::key::key_hash;
pub use crate::outcome::Outcome;

/// How one subscriber consumes: subject, queue group, dead-letter subject and
/// retry budget. Every `#[subscriber(...)]` argument has a method here, so apps
/// can configure subscribers without the macro.
///
/// ```
/// use ruststream::subscriber::SubscriberConfig;
///
/// let config = SubscriberConfig::new("orders.created")
///     .queue_group("billing")
///     .dead_letter("orders.dlq")
///     .max_attempts(5);
/// assert_eq!(config.retry_budget(), 5);
/// ```
#[derive(Clone, Debug)]
pub struct SubscriberConfig {
    pub(crate) subject: Text,
    pub(crate) queue_group: Option<Text>,
    pub(crate) dead_letter: Option<Text>,
    pub(crate) max_attempts: u32,
    pub(crate) mode: Mode,
    pub(crate) max_pending: Option<usize>,
    pub(crate) max_pending_per_key: Option<usize>,
    pub(crate) fail_fast: bool,
    pub(crate) receive_flow: Option<bool>,
    pub(crate) max_message_size: usize,
    pub(crate) middleware: Vec<SharedMiddleware>,
    pub(crate) batch: Option<Batch>,
}

/// How a batch handler's batches are made: `batch(max = 100, wait = "5ms")`.
///
/// A batch holds at most `max` records, one job permit each (JQ-7). It is
/// handed to the handler when it is full, when `wait` has passed since its
/// first record, when no job permit is free for another record (a batch
/// never waits for a permit while it holds some), or when the app stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Most records in one batch (at least 1).
    pub max: usize,
    /// How long a batch waits for more records after its first; zero takes
    /// only what is already at hand.
    pub wait: std::time::Duration,
}

/// How a subscriber's deliveries are scheduled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// One delivery at a time, in order. The default.
    #[default]
    Sequential,
    /// `n` worker tasks on the app runtime, each with a mailbox of one; at most
    /// `n` deliveries in flight. With `by_key`, deliveries of one key
    /// run one at a time in arrival order.
    Workers {
        /// Worker tasks.
        n: usize,
        /// Keep per-key order.
        by_key: bool,
    },
    /// `n` OS threads, each with its own current-thread runtime, fed through
    /// rings of 8 slots; read-ahead at most `n × 9`. Handlers may be
    /// `!Send`.
    Threads {
        /// Dedicated threads.
        n: usize,
        /// Keep per-key order.
        by_key: bool,
    },
}

impl SubscriberConfig {
    /// Default number of deliveries before a failing message is rejected.
    pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

    /// Default largest message (headers + payload) a subscriber accepts:
    /// 64 KiB.
    pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 64 * 1024;

    /// Default `max_pending` per worker of a by-key subscriber.
    pub const DEFAULT_PENDING_PER_WORKER: usize = 16;

    /// A subscriber to `subject`, with defaults for everything else.
    pub fn new(subject: impl Into<Text>) -> Self {
        SubscriberConfig {
            subject: subject.into(),
            queue_group: None,
            dead_letter: None,
            max_attempts: Self::DEFAULT_MAX_ATTEMPTS,
            mode: Mode::Sequential,
            max_pending: None,
            max_pending_per_key: None,
            fail_fast: false,
            receive_flow: None,
            max_message_size: Self::DEFAULT_MAX_MESSAGE_SIZE,
            middleware: Vec::new(),
            batch: None,
        }
    }

    /// Hands the handler batches of up to `max` records, waiting up to
    /// `wait` after the first record for more (see [`Batch`]). The
    /// subscriber must implement
    /// [`SendSubscriber::handle_batch`]; `#[subscriber(.., batch(..))]`
    /// does, for a function whose body argument is a `Vec`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream::subscriber::SubscriberConfig;
    ///
    /// let config = SubscriberConfig::new("clicks").batch(100, Duration::from_millis(5));
    /// assert_eq!(config.batching().map(|b| b.max), Some(100));
    /// ```
    pub fn batch(mut self, max: usize, wait: std::time::Duration) -> Self {
        self.batch = Some(Batch { max, wait });
        self
    }

    /// The batch settings of a batch handler; `None` for one that takes
    /// one message at a time.
    pub fn batching(&self) -> Option<Batch> {
        self.batch
    }

    /// Competes with the other members of `group` for messages.
    pub fn queue_group(mut self, group: impl Into<Text>) -> Self {
        self.queue_group = Some(group.into());
        self
    }

    /// Where rejected and exhausted messages go.
    pub fn dead_letter(mut self, subject: impl Into<Text>) -> Self {
        self.dead_letter = Some(subject.into());
        self
    }

    /// Deliveries a failing message gets before it is rejected (at least 1).
    /// A delivery that arrives past it — no earlier run settled it, because
    /// the handler took the process down — is dead-lettered before the
    /// handler runs ("attempts exhausted"), so a crash loop ends. Brokers
    /// with a delivery limit of their own get it too (JetStream
    /// `max_deliver`, RabbitMQ quorum queues' delivery limit).
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts.max(1);
        self
    }

    /// Fail fast: when a delivery of this subscriber is given up (rejected
    /// after its handler failed), the whole app shuts down.
    pub fn fail_fast(mut self, on: bool) -> Self {
        self.fail_fast = on;
        self
    }

    /// `workers(n)`: `n` deliveries in flight at most.
    pub fn workers(mut self, n: usize) -> Self {
        self.mode = Mode::Workers { n, by_key: false };
        self
    }

    /// `workers(n, by_key)`: per-key order on `n` workers.
    pub fn workers_by_key(mut self, n: usize) -> Self {
        self.mode = Mode::Workers { n, by_key: true };
        self
    }

    /// `threads(n)`: dedicated OS threads.
    pub fn threads(mut self, n: usize) -> Self {
        self.mode = Mode::Threads { n, by_key: false };
        self
    }

    /// `threads(n, by_key)`: dedicated threads with per-key order.
    pub fn threads_by_key(mut self, n: usize) -> Self {
        self.mode = Mode::Threads { n, by_key: true };
        self
    }

    /// Deliveries a `workers(n, by_key)` subscriber may hold in its owner
    /// FIFOs at once: its read-ahead bound. Default `16 × n`.
    pub fn max_pending(mut self, n: usize) -> Self {
        self.max_pending = Some(n);
        self
    }

    /// Whether job-queue pressure may pause this subscriber's receive flow.
    /// Default: on for queue-group subscribers — competing
    /// consumers are the request/reply sources of a service — and off for
    /// fan-out (pub/sub) subscribers, which pressure never pauses.
    pub fn receive_flow(mut self, on: bool) -> Self {
        self.receive_flow = Some(on);
        self
    }

    /// Whether pressure may pause the receive flow (see
    /// [`receive_flow`](Self::receive_flow)).
    pub fn pausable(&self) -> bool {
        self.receive_flow.unwrap_or(self.queue_group.is_some())
    }

    /// Deliveries one key may hold in a `workers(n, by_key)` subscriber's
    /// owner FIFO (queued plus running; default: `max_pending`). A *request*
    /// for a key at its limit is refused at once: the caller gets
    /// [`Error::StructuralLimit`](crate::Error::StructuralLimit) and the
    /// refusal is counted (`ruststream_structural_rejects_total`). A one-way
    /// message waits for its key's room instead.
    pub fn max_pending_per_key(mut self, n: usize) -> Self {
        self.max_pending_per_key = Some(n);
        self
    }

    /// Largest message (headers + payload, in bytes) this subscriber accepts
    /// (default 64 KiB). A larger one is refused before decode: a
    /// request caller gets [`Error::Protocol`](crate::Error::Protocol), a
    /// one-way message is rejected (dead-lettered where configured) and
    /// counted in `ruststream_oversized_total`. The handler never sees it.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes;
        self
    }

    /// Wraps this subscriber's handler in a [`tower::Layer`] (see
    /// [`middleware`](crate::middleware)): the first added runs outermost,
    /// inside the app's own ([`App::middleware`](crate::App::middleware)).
    /// A `#[subscriber(.., threads(n))]`, whose handler future may be
    /// `!Send`, takes none: the app refuses to start.
    pub fn middleware(mut self, layer: impl Middleware) -> Self {
        self.middleware.push(SharedMiddleware(Arc::new(layer)));
        self
    }

    /// The subject.
    pub fn subject(&self) -> &Text {
        &self.subject
    }

    /// The same settings on another subject: one read from the environment,
    /// or a name of its own per test run.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// #[subscriber("orders")]
    /// async fn confirm(_order: Bytes) {}
    ///
    /// let subject = std::env::var("ORDERS_SUBJECT").unwrap_or_else(|_| "orders.eu".into());
    /// let app = App::new()
    ///     .broker(MemoryBroker::new())
    ///     .subscriber(confirm.configure(|c| c.on_subject(subject)));
    /// # drop(app);
    /// ```
    pub fn on_subject(mut self, subject: impl Into<Text>) -> Self {
        self.subject = subject.into();
        self
    }

    /// The retry budget.
    pub fn retry_budget(&self) -> u32 {
        self.max_attempts
    }

    /// The execution mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    pub(crate) fn pending_limit(&self, workers: usize) -> usize {
        self.max_pending
            .unwrap_or(workers * Self::DEFAULT_PENDING_PER_WORKER)
    }

    /// Checks settings that the builder cannot refuse by type.
    pub(crate) fn validate(&self) -> crate::Result<()> {
        let bad = |what: &str| {
            Err(crate::Error::Config(format!(
                "subscriber `{}`: {what}",
                self.subject
            )))
        };
        match self.mode {
            Mode::Workers { n: 0, .. } => bad("workers(n) needs n >= 1"),
            Mode::Threads { n: 0, .. } => bad("threads(n) needs n >= 1"),
            _ if self.max_pending == Some(0) => bad("max_pending must be at least 1"),
            _ if self.max_message_size == 0 => bad("max_message_size must be at least 1"),
            _ if self.max_pending_per_key == Some(0) => {
                bad("max_pending_per_key must be at least 1")
            }
            Mode::Sequential | Mode::Workers { by_key: false, .. } | Mode::Threads { .. }
                if self.max_pending_per_key.is_some() =>
            {
                bad("max_pending_per_key applies to workers(n, by_key) only")
            }
            _ if self.batch.is_some_and(|b| b.max == 0) => bad("batch(max) needs max >= 1"),
            Mode::Workers { .. } | Mode::Threads { .. } if self.batch.is_some() => bad(
                "batch(..) runs one batch at a time in the subscriber's own loop: \
                 it does not combine with workers(n) or threads(n)",
            ),
            _ => Ok(()),
        }
    }

    pub(crate) fn subscribe_options(&self) -> crate::SubscribeOptions {
        crate::SubscribeOptions {
            subject: self.subject.clone(),
            queue_group: self.queue_group.clone(),
            dead_letter: self.dead_letter.clone(),
            receive_flow: self.pausable(),
            max_deliveries: Some(self.max_attempts),
        }
    }
}

/// What a handler invocation may look at: the delivery, the app, and the
/// broker that delivered it. Extractors
/// ([`FromDelivery`](crate::extract::FromDelivery)) read from it.
pub struct Scope<'a> {
    envelope: &'a Envelope,
    app: &'a AppHandle,
    broker: &'a dyn ErasedBroker,
    /// Created with the first [`Ctx`]: the follow-ups it may ask for.
    follow_ups: OnceLock<Arc<FollowUps>>,
}

impl<'a> Scope<'a> {
    #[inline]
    pub(crate) fn new(
        envelope: &'a Envelope,
        app: &'a AppHandle,
        broker: &'a dyn ErasedBroker,
    ) -> Self {
        Scope {
            envelope,
            app,
            broker,
            follow_ups: OnceLock::new(),
        }
    }

    /// A scope whose follow-ups are made already (the middleware path).
    pub(crate) fn with_follow_ups(
        envelope: &'a Envelope,
        app: &'a AppHandle,
        broker: &'a dyn ErasedBroker,
        follow_ups: Arc<FollowUps>,
    ) -> Self {
        Scope {
            envelope,
            app,
            broker,
            follow_ups: OnceLock::from(follow_ups),
        }
    }

    /// The delivery being handled.
    pub fn envelope(&self) -> &'a Envelope {
        self.envelope
    }

    /// The app.
    pub fn app(&self) -> &'a AppHandle {
        self.app
    }

    /// The handler context for this delivery.
    pub fn ctx<R: CtxRuntime>(&self) -> Ctx<R> {
        let follow_ups = self
            .follow_ups
            .get_or_init(|| Arc::new(FollowUps::new(self.app.clone())));
        Ctx::new(
            self.envelope,
            self.app,
            self.broker.clone_arc(),
            Arc::clone(follow_ups),
        )
    }

    /// The shared state of type `T` (see [`App::state`](crate::App::state)).
    ///
    /// # Panics
    /// If the app has no state of type `T`. `App::start` checks every type a
    /// subscriber lists in [`Subscriber::required_state`] (all of a
    /// `#[subscriber]`'s `State<T>` arguments), so only a hand-written
    /// subscriber that leaves one out gets here.
    pub fn state<T: Send + Sync + 'static>(&self) -> State<T> {
        match self.app.state::<T>() {
            Some(value) => State(value),
            None => panic!(
                "no shared state of type `{}`: register it with `App::state(..)`",
                std::any::type_name::<T>()
            ),
        }
    }

    /// The follow-ups a handler asked for, if it took a `Ctx`.
    #[inline]
    pub(crate) fn into_follow_ups(self) -> Option<Arc<FollowUps>> {
        self.follow_ups.into_inner()
    }
}

/// Typed shared state as a handler argument: `db: State<Pool>` gives the
/// value registered with [`App::state`](crate::App::state).
///
/// ```
/// use ruststream::prelude::*;
/// use ruststream::State;
///
/// struct Greeting {
///     word: String,
/// }
///
/// #[subscriber("names")]
/// async fn greet(name: String, greeting: State<Greeting>) -> String {
///     format!("{}, {name}", greeting.word)
/// }
///
/// let app = App::new()
///     .broker(MemoryBroker::new())
///     .state(Greeting { word: "hello".into() })
///     .subscriber(greet);
/// # drop(app);
/// ```
#[derive(Debug)]
pub struct State<T>(pub Arc<T>);

impl<T> State<T> {
    /// A state value, for calling a handler directly (in a unit test) the
    /// way the app would.
    ///
    /// ```
    /// use ruststream::prelude::*;
    ///
    /// struct Rate {
    ///     per_cent: f64,
    /// }
    ///
    /// #[subscriber("prices")]
    /// async fn convert(cents: u64, rate: State<Rate>) -> f64 {
    ///     cents as f64 * rate.per_cent
    /// }
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// assert_eq!(convert(100, State::new(Rate { per_cent: 0.5 })).await, 50.0);
    /// # });
    /// ```
    pub fn new(value: T) -> Self {
        State(Arc::new(value))
    }
}

impl<T> From<Arc<T>> for State<T> {
    fn from(value: Arc<T>) -> Self {
        State(value)
    }
}

impl<T> Clone for State<T> {
    fn clone(&self) -> Self {
        State(Arc::clone(&self.0))
    }
}

impl<T> std::ops::Deref for State<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// A message handler with its configuration. `#[subscriber]` implements it for
/// a hidden companion type of the annotated function; implement it by hand to
/// build subscribers at run time.
///
/// The handler future may be `!Send`: such a subscriber runs only in
/// `threads(n)` mode. Every other mode needs [`SendSubscriber`] too.
pub trait Subscriber: Send + Sync + 'static {
    /// The decoded message body.
    type Body: Send + 'static;
    /// The payload format.
    type Codec: Codec;

    /// Subject and settings.
    fn config(&self) -> SubscriberConfig;

    /// Decodes a payload (a failure never reaches [`handle`](Self::handle)).
    fn decode(&self, payload: &Bytes) -> Result<Self::Body, BoxError>;

    /// The ordering key of a delivery for `by_key` modes, as a hash. The
    /// default is the delivery's own key; deliveries without one share a key.
    fn key(&self, body: &Self::Body, envelope: &Envelope) -> u64 {
        let _ = body;
        crate::key::key_hash(&envelope.key().map(Text::as_str))
    }

    /// Runs the handler on a decoded body.
    fn handle(&self, body: Self::Body, scope: &Scope<'_>) -> impl Future<Output = Outcome>;

    /// The shared state types the handler takes. [`App::start`](crate::App::start)
    /// refuses to start when one of them is not registered: a missing state
    /// is a configuration error, never a failed delivery. `#[subscriber]`
    /// lists every `State<T>` argument; the default lists none.
    fn required_state(&self) -> Vec<StateKey> {
        Vec::new()
    }

    /// The handler's name, for errors and logs: its type's path by default
    /// (for `#[subscriber]`, the path of the function).
    fn name(&self) -> &'static str {
        std::any::type_name::<Self>()
    }

    /// The content type [`decode`](Self::decode) reads. A delivery whose
    /// `content-type` header names another is malformed: it never reaches
    /// the handler. `None` (the default) takes any. `#[subscriber]` answers
    /// its codec's, or `None` for a raw body (`Bytes`, `String`, `Vec<u8>`).
    fn content_type(&self) -> Option<&'static str> {
        None
    }

    /// The content type of the replies [`handle`](Self::handle) encodes,
    /// set on each reply's `content-type` header; `None` (the default) sets
    /// none. `#[subscriber]` answers its codec's, or `None` for a raw reply.
    fn reply_content_type(&self) -> Option<&'static str> {
        None
    }

    /// The types of the messages it takes and replies with, for documents
    /// (`App::asyncapi`, feature `asyncapi`).
    /// `#[subscriber]` names its body and reply types, with their JSON
    /// Schemas when they implement `schemars::JsonSchema`; the default
    /// names the body type and no reply.
    fn message_types(&self) -> MessageTypes {
        MessageTypes::of::<Self::Body, ()>()
    }
}

/// One shared state type, as [`Subscriber::required_state`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateKey {
    id: TypeId,
    name: &'static str,
}

impl StateKey {
    /// The key of `T`.
    pub fn of<T: Send + Sync + 'static>() -> Self {
        StateKey {
            id: TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
        }
    }

    /// The type's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    pub(crate) fn id(&self) -> TypeId {
        self.id
    }
}

/// A [`Subscriber`] whose handler future is `Send`: it can run in every mode.
pub trait SendSubscriber: Subscriber {
    /// [`Subscriber::handle`], as a `Send` future.
    fn handle_send(
        &self,
        body: Self::Body,
        scope: &Scope<'_>,
    ) -> impl Future<Output = Outcome> + Send;

    /// Runs the handler on a batch of decoded bodies, in arrival order
    /// (a subscriber configured with [`SubscriberConfig::batch`]). The
    /// outcome settles every record of the batch: success acks each,
    /// a failure retries each (up to its own `max_attempts`) or rejects
    /// each. Records that did not decode never reach it: they are
    /// dead-lettered one by one, and the rest of the batch goes on.
    /// `scope` reads the app (shared state); its envelope is the first
    /// record's.
    ///
    /// The default fails every batch, saying the subscriber has no batch
    /// handler: `#[subscriber(.., batch(..))]` implements it.
    fn handle_batch(
        &self,
        bodies: Vec<Self::Body>,
        scope: &Scope<'_>,
    ) -> impl Future<Output = Outcome> + Send {
        let _ = (bodies, scope);
        let name = self.name();
        async move {
            Outcome::Failed(crate::HandlerError::reject(format!(
                "`{name}` is configured with batch(..) but implements no \
                 `SendSubscriber::handle_batch`"
            )))
        }
    }
}
