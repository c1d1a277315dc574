//! How one subscriber consumes: [`SubscriberConfig`], its execution
//! [`Mode`] and, for a batch handler, its [`Batch`].

use std::sync::Arc;

use crate::Text;
use crate::middleware::{Middleware, SharedMiddleware};

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
    pub(crate) max_pending_bytes_per_key: Option<usize>,
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
    /// `n` worker tasks on the app runtime, each taking its next delivery
    /// itself once idle; at most `n` deliveries in flight. With `by_key`, deliveries of one key
    /// run one at a time in arrival order.
    Workers {
        /// Worker tasks.
        n: usize,
        /// Keep per-key order.
        by_key: bool,
    },
    /// `n` OS threads, each with its own current-thread runtime; a busy
    /// thread claims its next deliveries itself, an idle one is fed by a
    /// task on the app runtime through its ring of 8 slots; read-ahead at
    /// most `n × 9`. Handlers may be `!Send`.
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
            max_pending_bytes_per_key: None,
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
    /// [`SendSubscriber::handle_batch`](super::SendSubscriber::handle_batch); `#[subscriber(.., batch(..))]`
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

    /// Bytes (headers + payload) one key may hold in a `workers(n, by_key)`
    /// subscriber's owner FIFO, queued plus running (default: no byte limit,
    /// only [`max_pending_per_key`](Self::max_pending_per_key)). A key with
    /// nothing in hand always takes one delivery, however large. Beyond the
    /// limit, as for the count: a *request* is refused at once with
    /// [`Error::StructuralLimit`](crate::Error::StructuralLimit), a one-way
    /// message waits for its key's room.
    pub fn max_pending_bytes_per_key(mut self, bytes: usize) -> Self {
        self.max_pending_bytes_per_key = Some(bytes);
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
            _ if self.max_pending_bytes_per_key == Some(0) => {
                bad("max_pending_bytes_per_key must be at least 1")
            }
            Mode::Sequential | Mode::Workers { by_key: false, .. } | Mode::Threads { .. }
                if self.max_pending_per_key.is_some() =>
            {
                bad("max_pending_per_key applies to workers(n, by_key) only")
            }
            Mode::Sequential | Mode::Workers { by_key: false, .. } | Mode::Threads { .. }
                if self.max_pending_bytes_per_key.is_some() =>
            {
                bad("max_pending_bytes_per_key applies to workers(n, by_key) only")
            }
            Mode::Sequential | Mode::Workers { by_key: false, .. } | Mode::Threads { .. }
                if self.max_pending.is_some() =>
            {
                bad("max_pending bounds the owner FIFOs of workers(n, by_key) only")
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
            start_paused: false,
            max_deliveries: Some(self.max_attempts),
        }
    }
}
