//! The Core binding seam: the traits every broker adapter implements.
//!
//! * [`Broker`]: subscribe, publish (one operation per call), close.
//! * [`Subscription`]: a source the runtime *pulls* from only when it has
//!   capacity; nothing runs ahead of the pull except the binding's own
//!   receive queue, bounded by its byte HWM.
//! * [`Delivery`]: one received message; settling consumes it, so a delivery
//!   cannot be settled twice.
//! * [`Requester`]: the request/reply capability; replies complete the caller
//!   directly and never pass through a subscription.
//!
//! The per-subscriber loop is generic over these traits: no boxing and no
//! dynamic dispatch per message.

pub(crate) mod erased;

pub use erased::DynRequester;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(any(
    feature = "nats",
    feature = "redis",
    feature = "rabbitmq",
    feature = "mqtt",
    feature = "kafka"
))]
mod known_text;
pub mod memory;
#[cfg(feature = "mqtt")]
pub mod mqtt;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(any(
    feature = "nats",
    feature = "redis",
    feature = "rabbitmq",
    feature = "mqtt"
))]
mod pull_flow;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;
pub(crate) mod subject;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::ingress::{JobQueue, ReceiveFlow};
use crate::message::header;
use crate::{Envelope, Error, Message, Result, Text};

/// What a subscriber asks a broker for.
#[derive(Clone, Debug)]
pub struct SubscribeOptions {
    /// Subject (or pattern, where the broker supports wildcards).
    pub subject: Text,
    /// Subscriptions sharing a queue group compete for messages; without one,
    /// every subscription gets every message.
    pub queue_group: Option<Text>,
    /// Where `reject` sends a message; `None` drops it with a warning.
    pub dead_letter: Option<Text>,
    /// Whether this subscription is a request/reply source whose receive flow
    /// the job queue's pressure state may pause. Plain pub/sub
    /// fan-out never is.
    pub receive_flow: bool,
    /// The receive flow starts paused: the job queue's pressure state when
    /// the source subscribes, so a source that joins a PAUSED app is never
    /// live before it gets that state (JQ-17). A binding whose switch can
    /// be set before the source takes anything honours it; the job queue
    /// applies the current state again when it registers the switch.
    pub start_paused: bool,
    /// Deliveries of one message after which a broker that counts them
    /// gives up on it (RabbitMQ quorum queues' delivery limit; JetStream's
    /// `max_deliver`, set one higher so the runtime sees the last delivery
    /// and dead-letters it as "attempts exhausted"). The runtime rejects at
    /// `max_attempts` on its own; this catches a message whose handler
    /// crashes the process every time, so it never gets to reject it. The
    /// app sets it to the subscriber's `max_attempts`.
    pub max_deliveries: Option<u32>,
}

impl SubscribeOptions {
    /// Fan-out subscription to `subject`.
    pub fn new(subject: impl Into<Text>) -> Self {
        SubscribeOptions {
            subject: subject.into(),
            queue_group: None,
            dead_letter: None,
            receive_flow: false,
            start_paused: false,
            max_deliveries: None,
        }
    }

    /// Sets [`max_deliveries`](Self::max_deliveries).
    pub fn max_deliveries(mut self, deliveries: u32) -> Self {
        self.max_deliveries = Some(deliveries.max(1));
        self
    }

    /// Joins a queue group (competing consumers).
    pub fn queue_group(mut self, group: impl Into<Text>) -> Self {
        self.queue_group = Some(group.into());
        self
    }

    /// Marks the subscription as a request/reply source: it exposes a
    /// receive-flow switch ([`Subscription::receive_flow`]) for the job
    /// queue's pressure state.
    pub fn receive_flow(mut self, on: bool) -> Self {
        self.receive_flow = on;
        self
    }

    /// Sets [`start_paused`](Self::start_paused).
    pub fn start_paused(mut self, paused: bool) -> Self {
        self.start_paused = paused;
        self
    }

    /// Sets the dead-letter subject for rejected messages.
    pub fn dead_letter(mut self, subject: impl Into<Text>) -> Self {
        self.dead_letter = Some(subject.into());
        self
    }
}

/// A Core binding: one connection to one broker.
///
/// Cloning is cheap and shares the connection.
pub trait Broker: Clone + Send + Sync + 'static {
    /// The receive stream of one subscription.
    type Subscription: Subscription;

    /// A short name for logs and metrics (`"memory"`, `"nats"`).
    fn name(&self) -> &'static str;

    /// Opens a subscription. When this returns, messages published afterwards
    /// are retained for it.
    fn subscribe(
        &self,
        options: SubscribeOptions,
    ) -> impl Future<Output = Result<Self::Subscription>> + Send;

    /// Publishes one message: exactly one binding operation. Where the
    /// broker's queues are full the binding waits for space until `deadline`
    /// and then fails with [`Error::DeadlineExceeded`](crate::Error).
    /// `None` uses the binding's default publish timeout.
    fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Closes the connection. Later calls fail with `Error::Closed`; closing
    /// twice is fine.
    fn close(&self) -> impl Future<Output = Result<()>> + Send;

    /// This broker's request/reply, for code that holds the broker without
    /// its type (a handler's [`Ctx::request`](crate::Ctx::request)).
    /// Brokers that implement [`Requester`] return `Some(self)`; the
    /// default is `None`.
    fn as_requester(&self) -> Option<&dyn DynRequester> {
        None
    }

    /// Where the broker is, `host:port` without scheme or credentials, for
    /// documents (an AsyncAPI server). `None` (the default) for a broker
    /// inside the process.
    fn host(&self) -> Option<String> {
        None
    }
}

/// `host:port` of a URL: no scheme, credentials, path or query.
#[cfg_attr(
    not(any(feature = "nats", feature = "redis", feature = "rabbitmq")),
    allow(dead_code)
)]
pub(crate) fn host_of(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.split(['/', '?']).next().unwrap_or(rest);
    rest.rsplit_once('@')
        .map_or(rest, |(_, host)| host)
        .to_owned()
}

/// One receive stream. The runtime never holds a job permit while a
/// subscription has nothing to hand out: it waits for
/// [`ready`](Subscription::ready) holding nothing, then takes a permit, then
/// claims the delivery with [`try_next`](Subscription::try_next) without
/// waiting, and returns the permit when the claim finds nothing.
pub trait Subscription: Send + 'static {
    /// The delivery type this binding hands out.
    type Delivery: Delivery;

    /// Waits, holding no job permit, until a delivery is at hand for
    /// [`try_next`](Self::try_next); `false` once the subscription or its
    /// broker is closed. Level-triggered: it may resolve and the claim then
    /// find nothing (another member of a queue group took the delivery),
    /// and the runtime simply waits again. Cancel-safe: dropping the future
    /// loses nothing.
    ///
    /// A binding whose broker can say "something is waiting" without
    /// handing it over (the memory Core) waits for exactly that. Others
    /// receive one delivery into a slot of their own and hand it out from
    /// there: a read-ahead of one record per subscription, on top of
    /// whatever the broker's own flow control (prefetch, pull batch) keeps
    /// in the client.
    fn ready(&mut self) -> impl Future<Output = bool> + Send;

    /// The delivery at hand, without waiting; `None` when there is none
    /// (nothing at hand, or the end: [`ready`](Self::ready) tells which).
    /// The runtime calls it only while it holds a permit for the delivery,
    /// and keeps the cooperative budget itself.
    fn try_next(&mut self) -> Option<Self::Delivery>;

    /// Up to `max` deliveries at hand, without waiting, appended to `batch`;
    /// returns how many. A batch handler's loop holds a job permit for each
    /// of the `max` before it asks (JQ-7) and gives back the ones it did
    /// not use. The default calls [`try_next`](Self::try_next) until it
    /// finds nothing; a binding that can hand several records out in one
    /// step (one lock, one buffer swap) does so.
    fn try_next_batch(&mut self, max: usize, batch: &mut Vec<Self::Delivery>) -> usize {
        let mut taken = 0;
        while taken < max {
            let Some(delivery) = self.try_next() else {
                break;
            };
            batch.push(delivery);
            taken += 1;
        }
        taken
    }

    /// The next delivery, waiting for one; `None` once the subscription or its
    /// broker is closed. Cancel-safe: dropping the future loses nothing.
    /// For tests and tools that read a subscription by hand; the runtime's
    /// loops use [`ready`](Self::ready) and [`try_next`](Self::try_next).
    fn next(&mut self) -> impl Future<Output = Option<Self::Delivery>> + Send {
        async move {
            loop {
                if !self.ready().await {
                    return None;
                }
                if let Some(delivery) = self.try_next() {
                    return Some(delivery);
                }
            }
        }
    }

    /// The receive-flow switch of a request/reply source: the app
    /// registers it with its job queue, which sets it PAUSED/RUNNING as
    /// pressure changes. `None` (the default) for sources pressure must not
    /// pause, and for bindings without one.
    fn receive_flow(&self) -> Option<Arc<dyn ReceiveFlow>> {
        None
    }

    /// The app's job queue, handed over before the first `ready`. A binding
    /// that reads in batches takes one more permit (without waiting) for
    /// every record it asks for beyond the first — the first is its
    /// read-ahead of one (see [`ready`](Self::ready)) — and keeps each with
    /// its buffered record until it hands the record out, so a read never
    /// asks for more records than permits are held. The default
    /// ignores it.
    fn use_job_queue(&mut self, jobs: &Arc<JobQueue>) {
        let _ = jobs;
    }
}

/// [`Subscription::ready`] and [`Subscription::try_next`] for a binding
/// that cannot tell "a delivery is waiting" without receiving it: `ready`
/// receives one delivery (through the binding's own `next`) into the
/// subscription's `ahead` slot, `try_next` hands it out, and `next` must
/// look there first. With `$buffered` — the binding's method that takes a
/// delivery its client has already received, without waiting — `try_next`
/// goes on to that when the slot is empty, so a loop with a backlog takes
/// one delivery after another without waiting for `ready` in between.
#[cfg(any(
    feature = "nats",
    feature = "redis",
    feature = "rabbitmq",
    feature = "kafka"
))]
macro_rules! read_ahead_of_one {
    ($delivery:ty $(, $buffered:ident)?) => {
        async fn ready(&mut self) -> bool {
            if self.ahead.is_none() {
                self.ahead = $crate::binding::Subscription::next(self).await;
            }
            self.ahead.is_some()
        }

        fn try_next(&mut self) -> Option<$delivery> {
            let ahead = self.ahead.take();
            $(let ahead = ahead.or_else(|| self.$buffered());)?
            ahead
        }

        $(
        /// What the client holds, up to `max`, as one step that tokio's
        /// per-task budget does not cut short (the client's channels spend
        /// it): the runtime keeps its own.
        fn try_next_batch(&mut self, max: usize, batch: &mut Vec<$delivery>) -> usize {
            let mut taken = 0;
            if max > 0
                && let Some(delivery) = self.ahead.take()
            {
                batch.push(delivery);
                taken += 1;
            }
            $crate::coop::unconstrained(|| {
                while taken < max {
                    let Some(delivery) = self.$buffered() else {
                        break;
                    };
                    batch.push(delivery);
                    taken += 1;
                }
            });
            taken
        }
        )?
    };
}
#[cfg(any(
    feature = "nats",
    feature = "redis",
    feature = "rabbitmq",
    feature = "kafka"
))]
pub(crate) use read_ahead_of_one;

/// One received message, not yet settled.
///
/// Settlement methods take `self`: settling twice does not compile (the one
/// exception, [`try_ack`](Self::try_ack), settles in place and leaves only a
/// drop to do). A delivery dropped unsettled is redelivered by the broker
/// (where the broker can).
pub trait Delivery: Send + Sync + 'static {
    /// Subject, payload, headers and the rest of what was received.
    fn envelope(&self) -> &Envelope;

    /// Done: never deliver this message again.
    fn ack(self) -> impl Future<Output = Result<()>> + Send;

    /// Acks without waiting where the binding can: `Some` with the
    /// result once the delivery is settled, or `None` (the default) to
    /// settle it with [`ack`](Self::ack). After `Some` the delivery is
    /// done: drop it (which then does nothing); settling it again is a
    /// logic error a binding may panic on. In place rather than by value,
    /// so the delivery is not moved (copied) on the path of every message.
    fn try_ack(&mut self) -> Option<Result<()>> {
        None
    }

    /// Failed: deliver it again, with attempt + 1.
    fn nack(self) -> impl Future<Output = Result<()>> + Send;

    /// Failed for good: never redeliver; dead-letter it (with `reason`) where a
    /// dead-letter target is configured, else drop it with a warning.
    fn reject(self, reason: &str) -> impl Future<Output = Result<()>> + Send;

    /// Done for now, but deliver it again after `delay` with one more retry
    /// counted ([`Ctx::retry_after`](crate::Ctx::retry_after)). A
    /// binding whose broker can hold the delay (RabbitMQ: TTL and
    /// dead-letter routing) hands the copy over and settles this delivery,
    /// so the retry survives a crash of this process. The default hands the
    /// delivery back: the runtime acks it and republishes the copy from a
    /// timer of its own, which a graceful shutdown flushes.
    fn retry_after(self, delay: Duration) -> impl Future<Output = RetryAfter<Self>> + Send
    where
        Self: Sized,
    {
        let _ = delay;
        std::future::ready(RetryAfter::NotHeld(self))
    }
}

/// What [`Delivery::retry_after`] did.
#[derive(Debug)]
pub enum RetryAfter<D> {
    /// The broker holds the delayed copy and the delivery is settled; `Err`
    /// when handing it over failed, and the delivery goes back to the broker
    /// (it is not lost).
    Held(Result<()>),
    /// The broker cannot hold a delay: the delivery, unsettled.
    NotHeld(D),
}

/// Request/reply: the capability of brokers with a reply path.
///
/// Bindings implement [`send_request`](Self::send_request); callers use
/// [`request_message`](Self::request_message), which turns a reply that
/// reports a failure into an error — the same meaning on every broker and
/// in [`Publisher::request_message`](crate::Publisher::request_message).
pub trait Requester: Broker {
    /// Publishes `message` to `subject` with a fresh reply address and waits up
    /// to `timeout` for the first reply, as it came: a reply whose status
    /// header reports a failure is still `Ok` here. A reply arriving later
    /// is dropped: the first terminal result wins.
    fn send_request(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> impl Future<Output = Result<Envelope>> + Send;

    /// Sends a request and waits up to `timeout` for its reply. A reply that
    /// reports a failure is an error: [`Error::Protocol`] (the server refused
    /// the payload before its handler), [`Error::Handler`] or
    /// [`Error::StructuralLimit`].
    ///
    /// ```
    /// use std::time::Duration;
    /// use ruststream::prelude::*;
    ///
    /// #[subscriber("sizes")]
    /// async fn size(order: u32) -> u32 { order * 2 }
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let broker = MemoryBroker::new();
    /// let running = App::new().broker(broker.clone()).subscriber(size).start().await?;
    /// // Not a number: the server refuses it before the handler.
    /// let refused = broker
    ///     .request_message("sizes", Message::new("large"), Duration::from_secs(1))
    ///     .await;
    /// assert!(matches!(refused, Err(ruststream::Error::Protocol(_))), "{refused:?}");
    /// running.shutdown().await?;
    /// # Ok::<_, ruststream::Error>(()) }).unwrap();
    /// ```
    fn request_message(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> impl Future<Output = Result<Envelope>> + Send {
        // Made inside the block: a request future built outside would be
        // moved into it, a copy of its whole state on every request.
        async move { reply_result(self.send_request(subject, message, timeout).await?) }
    }
}

/// Maps a reply's status header to a result: what
/// [`Requester::request_message`] does with the reply
/// [`Requester::send_request`] returns.
pub fn reply_result(reply: Envelope) -> Result<Envelope> {
    let error = || reply.headers().get(header::ERROR).unwrap_or("").to_owned();
    match reply.headers().get(header::STATUS) {
        Some(PROTOCOL_ERROR) => Err(Error::Protocol(error())),
        Some("handler-error") => Err(Error::Handler(error())),
        Some("structural-limit") => Err(Error::StructuralLimit(error())),
        _ => Ok(reply),
    }
}

/// The headers every binding's dead-letter copy of `env` carries: the
/// subject it came from, the reason, and the attempt it was given up at,
/// counted as `max_attempts` counts (redeliveries and `retry_after`s).
pub(crate) fn dead_letter_headers(env: &Envelope, reason: &str) -> [(&'static str, String); 3] {
    [
        (header::ORIGINAL_SUBJECT, env.subject().as_str().to_owned()),
        (header::ERROR, reason.to_owned()),
        (header::ATTEMPT, env.total_attempt().to_string()),
    ]
}

/// `message` with the [`dead_letter_headers`] of `env`.
pub(crate) fn with_dead_letter_headers(
    mut message: Message,
    env: &Envelope,
    reason: &str,
) -> Message {
    for (name, value) in dead_letter_headers(env, reason) {
        message = message.with_header(name, value);
    }
    message
}

/// The reply a request's caller gets when its request is refused before any
/// handler, for the reason given: [`reply_result`] reads it as
/// [`Error::Protocol`].
pub(crate) fn protocol_error_reply(reason: &str) -> Message {
    Message::new(bytes::Bytes::new())
        .with_header(header::ERROR, reason)
        .with_header(header::STATUS, PROTOCOL_ERROR)
}

/// The status a refused request's reply carries.
const PROTOCOL_ERROR: &str = "protocol-error";
