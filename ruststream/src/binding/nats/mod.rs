//! The NATS binding (feature `nats`), on [`async_nats`].
//!
//! * [`NatsBroker`]: core NATS — subjects with `*`/`>`, fan-out, queue groups,
//!   request/reply over NATS inboxes. Core NATS is at-most-once: `ack` is a
//!   no-op; `nack` redelivers to the same subscription through its private
//!   redelivery subject with attempt + 1; `reject` publishes to the
//!   dead-letter subject with the reason. A subscription's receive buffer is
//!   the client's bounded subscription channel
//!   ([`NatsBrokerBuilder::subscription_capacity`]).
//! * [`JetStream`]: durable streams with pull consumers — ack, nak
//!   (redelivery with the server's delivery count as the attempt), term.
//!   Messages are pulled only when the runtime asks for the next one, in
//!   pulls of at most [`StreamSpec::pull_window`] messages, so a saturated
//!   app never over-fetches; a paused receive flow stops pulling.
//!
//! Headers map both ways; the key and the correlation id travel as the
//! `ruststream-key` and `ruststream-correlation-id` headers. Disconnects and
//! reconnects are logged and counted (`ruststream_connection_events_total`);
//! the client reconnects on its own and JetStream redelivers what was not
//! acked.
//!
//! ```no_run
//! use ruststream::prelude::*;
//! use ruststream::nats::NatsBroker;
//!
//! #[subscriber("orders.created", queue_group = "billing")]
//! async fn bill(order_id: u64) {
//!     println!("billing {order_id}");
//! }
//!
//! # async fn run() -> ruststream::Result<()> {
//! let nats = NatsBroker::connect("nats://127.0.0.1:4222").await?;
//! App::new().broker(nats).subscriber(bill).run().await
//! # }
//! ```

mod ack_subject;
mod convert;
mod core;
mod durable;
mod given_up;
mod jetstream;
mod jetstream_delivery;
mod pull;
mod reconnects;
mod subjects;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use async_nats::{Client, ConnectOptions, Event};
use tokio::time::Instant;

pub use self::core::{NatsDelivery, NatsSubscription};
pub use self::jetstream::{JetStream, JetStreamSubscription, StreamSpec};
pub use self::jetstream_delivery::JetStreamDelivery;
use crate::binding::{Broker, Requester, SubscribeOptions};
use crate::{Envelope, Error, Message, Result};
/// The NATS client crate, for [`NatsBrokerBuilder::options`].
pub use async_nats;

/// A connection to a NATS server (core NATS). Cloning shares the connection.
#[derive(Clone)]
pub struct NatsBroker {
    client: Client,
    publish_timeout: Duration,
    closed: Arc<AtomicBool>,
    reconnects: reconnects::Reconnects,
    /// `host:port` of the URL it connected with.
    host: Arc<str>,
}

impl std::fmt::Debug for NatsBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBroker")
            .field("state", &self.client.connection_state())
            .finish_non_exhaustive()
    }
}

/// Settings for a [`NatsBroker`].
///
/// ```no_run
/// use std::time::Duration;
/// use ruststream::nats::NatsBroker;
///
/// # async fn run() -> ruststream::Result<()> {
/// let nats = NatsBroker::builder()
///     .name("billing")
///     .subscription_capacity(4096)
///     .publish_timeout(Duration::from_secs(2))
///     .connect("nats://127.0.0.1:4222")
///     .await?;
/// # drop(nats); Ok(()) }
/// ```
pub struct NatsBrokerBuilder {
    name: Option<String>,
    subscription_capacity: usize,
    publish_timeout: Duration,
    connection_timeout: Duration,
    options: Option<ConfigureOptions>,
}

type ConfigureOptions = Box<dyn FnOnce(ConnectOptions) -> ConnectOptions + Send>;

impl std::fmt::Debug for NatsBrokerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsBrokerBuilder")
            .field("name", &self.name)
            .field("subscription_capacity", &self.subscription_capacity)
            .field("publish_timeout", &self.publish_timeout)
            .field("connection_timeout", &self.connection_timeout)
            .field("options", &self.options.as_ref().map(|_| "<configured>"))
            .finish()
    }
}

impl Default for NatsBrokerBuilder {
    fn default() -> Self {
        NatsBrokerBuilder {
            name: None,
            subscription_capacity: 8192,
            publish_timeout: Duration::from_secs(10),
            connection_timeout: Duration::from_secs(5),
            options: None,
        }
    }
}

impl NatsBrokerBuilder {
    /// Connection name, shown by the server's monitoring.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// Messages one core subscription may buffer before the runtime takes
    /// them (default 8,192). Core NATS drops what a full buffer cannot take
    /// (a slow consumer); JetStream subscriptions pull instead and never
    /// overflow it.
    pub fn subscription_capacity(mut self, messages: usize) -> Self {
        self.subscription_capacity = messages;
        self
    }

    /// Deadline of a publish that passes none (default 10 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// How long connecting may take (default 5 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Client settings the builder has no method for — credentials, TLS,
    /// reconnect policy — applied to the client's
    /// [`async_nats::ConnectOptions`] after the builder's
    /// own (`ruststream::nats::async_nats` is the client crate). Leave the
    /// event callback to the builder: JetStream subscriptions learn from it
    /// that the connection came back, and pull again at once.
    ///
    /// ```no_run
    /// use ruststream::nats::NatsBroker;
    ///
    /// # async fn run() -> ruststream::Result<()> {
    /// let nats = NatsBroker::builder()
    ///     .options(|o| o.user_and_password("billing".into(), "s3cret".into()))
    ///     .connect("nats://127.0.0.1:4222")
    ///     .await?;
    /// # drop(nats); Ok(()) }
    /// ```
    pub fn options(
        mut self,
        configure: impl FnOnce(ConnectOptions) -> ConnectOptions + Send + 'static,
    ) -> Self {
        self.options = Some(Box::new(configure));
        self
    }

    /// Connects to `url` (for example `nats://127.0.0.1:4222`). An
    /// unreachable server, or one that refuses the credentials, is an
    /// [`Error::Transport`] naming the address.
    pub async fn connect(self, url: &str) -> Result<NatsBroker> {
        let reconnects = reconnects::Reconnects::default();
        let observed = reconnects.clone();
        let mut options = ConnectOptions::new()
            .subscription_capacity(self.subscription_capacity)
            .connection_timeout(self.connection_timeout)
            // Every publish path checks its subject itself, once per new
            // subject rather than on every message (`subjects::publish_subject`).
            .skip_subject_validation(true)
            .event_callback(move |event| {
                observed.observe(&event);
                connection_event(event);
                std::future::ready(())
            });
        if let Some(name) = self.name {
            options = options.name(name);
        }
        if let Some(configure) = self.options {
            options = configure(options);
        }
        let client = options.connect(url).await.map_err(|err| {
            Error::Transport(format!("cannot connect to NATS at {url}: {err}").into())
        })?;
        Ok(NatsBroker {
            client,
            publish_timeout: self.publish_timeout,
            closed: Arc::new(AtomicBool::new(false)),
            reconnects,
            host: crate::binding::host_of(url).into(),
        })
    }
}

/// Logs and counts what happens to a connection: an outage is visible even
/// while the client reconnects on its own.
fn connection_event(event: Event) {
    let name = match &event {
        Event::Connected => "connected",
        Event::Disconnected => "disconnected",
        Event::LameDuckMode => "lame_duck",
        Event::SlowConsumer(_) => "slow_consumer",
        Event::ServerError(_) => "server_error",
        Event::ClientError(_) => "client_error",
        Event::Draining => "draining",
        Event::Closed => "closed",
    };
    match event {
        Event::Connected => tracing::info!("NATS connection (re)established"),
        Event::SlowConsumer(sid) => tracing::warn!(
            sid,
            "NATS slow consumer: a core subscription's buffer is full and messages were dropped"
        ),
        other => tracing::warn!(event = %other, "NATS connection event"),
    }
    crate::metrics::connection_event("nats", name);
}

impl NatsBroker {
    /// Connects with default settings.
    pub async fn connect(url: &str) -> Result<NatsBroker> {
        NatsBrokerBuilder::default().connect(url).await
    }

    /// Settings for a new connection.
    pub fn builder() -> NatsBrokerBuilder {
        NatsBrokerBuilder::default()
    }

    /// The underlying `async-nats` client. It is connected with
    /// `skip_subject_validation(true)`: the broker checks the subject of
    /// each of its own publishes (an empty one, or one with whitespace, is
    /// [`Error::Config`]), once per new subject rather than on every
    /// message (subjects are kept for the life of the process, up to 64 KiB
    /// in all). Check a subject you publish to through this client yourself:
    /// the server closes a connection that sends it one with whitespace.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// JetStream on this connection, bound to the stream `spec` describes
    /// (created if missing, updated to the spec's subjects otherwise).
    pub async fn jetstream(&self, spec: StreamSpec) -> Result<JetStream> {
        JetStream::bind(self.clone(), spec).await
    }

    fn ensure_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("NATS connection is closed"));
        }
        Ok(())
    }

    fn deadline(&self, deadline: Option<Instant>) -> Instant {
        deadline.unwrap_or_else(|| Instant::now() + self.publish_timeout)
    }

    /// One core publish: into the client's bounded write buffer, waiting for
    /// room until `deadline` (default: the publish timeout from when the
    /// buffer is found full — a publish that finds room reads no clock).
    /// The future keeps the subject and the message as given; they become
    /// the client's on the first poll.
    fn publish_core<'a, 's>(
        &'a self,
        subject: &'s str,
        message: Message,
        deadline: Option<Instant>,
    ) -> CorePublish<'a, 's> {
        CorePublish {
            broker: self,
            subject,
            message: Some(message),
            deadline: deadline.ok_or(self.publish_timeout),
            waiting: None,
        }
    }
}

/// The client's message for `message`: one shape for every case (reply,
/// headers or neither). The payload is shared, not copied.
fn outbound(subject: &str, message: &Message) -> Result<async_nats::message::OutboundMessage> {
    let headers = convert::headers(message)?;
    let reply = message
        .reply_to()
        .map(|r| async_nats::Subject::from(r.as_str()));
    Ok(async_nats::message::OutboundMessage {
        subject: subjects::publish_subject(subject)?,
        reply,
        payload: message.payload().clone(),
        headers,
    })
}

/// Whether the message is a payload alone: no headers and no reply
/// subject for the client to carry.
fn payload_only(message: &Message) -> bool {
    message.reply_to().is_none() && !convert::carries_headers(message)
}

/// The wait of a publish that found the client's write buffer full: the
/// client's publish future and the deadline's timer in one box (the timer
/// is armed on its first poll).
type Waiting<'a> = Pin<Box<dyn Future<Output = Result<()>> + Send + 'a>>;

/// A core publish. The client's own future is large (~750 bytes) and every
/// caller's state would move it by value; here it is made and polled in
/// place on the first poll, which finishes whenever the client's write
/// buffer has room, and only a publish that must wait keeps one, boxed
/// with its deadline's timer.
pub(crate) struct CorePublish<'a, 's> {
    broker: &'a NatsBroker,
    subject: &'s str,
    /// Not handed to the client yet.
    message: Option<Message>,
    /// The deadline, or the timeout to count from the first wait.
    deadline: std::result::Result<Instant, Duration>,
    waiting: Option<Waiting<'a>>,
}

impl Future for CorePublish<'_, '_> {
    type Output = Result<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        use async_nats::client::traits::Publisher;
        let this = &mut *self;
        let client = &this.broker.client;
        if let Some(message) = this.message.take() {
            this.broker.ensure_open()?;
            // The first attempt takes clones (reference counts): when it
            // is pending it sent nothing (it waited for room), and the
            // message goes on boxed.
            let first = if payload_only(&message) {
                let subject = subjects::publish_subject(this.subject)?;
                poll_once(client.publish(subject, message.payload().clone()), cx)
            } else {
                poll_once(
                    client.publish_message(outbound(this.subject, &message)?),
                    cx,
                )
            };
            if let Poll::Ready(result) = first {
                return Poll::Ready(result.map_err(publish_error));
            }
            let outbound = outbound(this.subject, &message)?;
            let deadline = this
                .deadline
                .unwrap_or_else(|timeout| Instant::now() + timeout);
            this.waiting = Some(Box::pin(async move {
                let publish = client.publish_message(outbound);
                match tokio::time::timeout_at(deadline, publish).await {
                    Ok(sent) => sent.map_err(publish_error),
                    Err(_) => {
                        crate::metrics::deadline_exceeded("nats");
                        Err(Error::DeadlineExceeded(
                            "the NATS client's write buffer stayed full until the deadline",
                        ))
                    }
                }
            }));
        }
        let Some(waiting) = &mut this.waiting else {
            panic!("publish future polled after completion");
        };
        let sent = ready!(waiting.as_mut().poll(cx));
        this.waiting = None;
        Poll::Ready(sent)
    }
}

/// Polls `future` once, in place.
fn poll_once<F: Future>(future: F, cx: &mut Context<'_>) -> Poll<F::Output> {
    std::pin::pin!(future).poll(cx)
}

/// A publish the client refused: too large for the server is a structural
/// limit, the rest is transport.
fn publish_error(err: async_nats::PublishError) -> Error {
    match err.kind() {
        async_nats::client::PublishErrorKind::MaxPayloadExceeded => {
            Error::StructuralLimit(format!("NATS publish: {err}"))
        }
        _ => Error::Transport(err.into()),
    }
}

impl Broker for NatsBroker {
    fn as_requester(&self) -> Option<&dyn crate::binding::DynRequester> {
        Some(self)
    }

    type Subscription = NatsSubscription;

    fn name(&self) -> &'static str {
        "nats"
    }

    fn host(&self) -> Option<String> {
        Some(self.host.to_string())
    }

    async fn subscribe(&self, options: SubscribeOptions) -> Result<NatsSubscription> {
        self.ensure_open()?;
        NatsSubscription::open(self.clone(), options).await
    }

    fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<()>> + Send {
        self.publish_core(subject, message, deadline)
    }

    /// Flushes what is buffered, then marks the connection closed: later
    /// calls fail with `Error::Closed`, subscriptions end. Closing twice is
    /// fine.
    async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        if let Err(err) = self.client.flush().await {
            tracing::warn!(error = %err, "NATS flush at close failed");
        }
        Ok(())
    }
}

impl Requester for NatsBroker {
    async fn send_request(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        self.ensure_open()?;
        let to = subjects::publish_subject(subject)?;
        let headers = convert::headers(&message)?;
        let mut request = async_nats::Request::new()
            .payload(message.into_payload())
            .timeout(Some(timeout));
        if let Some(headers) = headers {
            request = request.headers(headers);
        }
        match self.client.send_request(to, request).await {
            Ok(reply) => {
                let message = convert::message(reply.payload, reply.headers.as_ref(), None);
                Ok(convert::envelope(reply.subject.as_str(), message, 1))
            }
            Err(err) => Err(match err.kind() {
                async_nats::RequestErrorKind::TimedOut => Error::Timeout(timeout),
                async_nats::RequestErrorKind::NoResponders => {
                    Error::NoResponders(subject.to_owned())
                }
                async_nats::RequestErrorKind::MaxPayloadExceeded => {
                    Error::StructuralLimit(format!("request to `{subject}`: {err}"))
                }
                _ => Error::Transport(err.into()),
            }),
        }
    }
}
