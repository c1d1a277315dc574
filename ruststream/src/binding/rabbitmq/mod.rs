//! The RabbitMQ binding (feature `rabbitmq`, AMQP 0.9.1 on `lapin`).
//!
//! * Subjects are routing keys on one durable topic exchange
//!   ([`RabbitBrokerBuilder::exchange`], default `ruststream`); `*` matches one
//!   word and `>` the rest (AMQP `#`).
//! * A queue group is a durable queue named `<group>@<subject>`, shared by its
//!   members; a fan-out subscription gets an exclusive, auto-deleted queue of
//!   its own. Both are declared and bound when the subscription opens, so
//!   messages published afterwards are kept for it.
//! * Publishes are persistent and wait for the publisher confirm: `Ok` means
//!   the broker has the message.
//! * `ack` is `basic.ack`; `nack` republishes a copy to the same queue with
//!   attempt + 1 and acks the original (RabbitMQ counts no redeliveries on
//!   classic queues); `reject` publishes to the dead-letter subject with the
//!   reason and acks, and the queue's dead-letter exchange is wired to that
//!   subject too. A delivery dropped unsettled is requeued.
//! * `retry_after` is kept by the broker: a TTL'd copy in a delay queue,
//!   dead-lettered back when due, so it survives a crash.
//! * Prefetch (`basic.qos`) is at most what the app's job queue can take.
//!
//! * Request/reply over direct reply-to (`amq.rabbitmq.reply-to`).
//! * A lost connection is recovered: the client reconnects with backoff and
//!   re-creates channels, queues, bindings and consumers; deliveries that
//!   were unsettled when it broke come back from the broker (attempt + 1),
//!   and publishes caught by the outage are sent again once it is back (a
//!   request only if it had not been sent yet: a reply may be on its way).

mod acks;
mod reply;
mod subscription;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties};
use tokio::time::Instant;

pub use self::subscription::{RabbitDelivery, RabbitSubscription};
use crate::binding::{Broker, SubscribeOptions};
use crate::{Error, Message, Result};

/// The longest delay a delay queue holds (its `x-expires`, a 32-bit count
/// of milliseconds, must exceed it by a minute); longer ones are left to the
/// runtime's timer.
const MAX_HELD_DELAY_MS: u32 = u32::MAX - 60_000;
/// How long a delay queue's declaration is trusted before it is renewed
/// (its lease runs a minute past its delay).
const REDECLARE_AFTER: Duration = Duration::from_secs(30);

/// Header carrying [`Message::key`].
const KEY: &str = "ruststream-key";
/// Header carrying the attempt of a republished redelivery.
const REDELIVERY: &str = "ruststream-redelivery";
/// Header carrying the original subject of a redelivery (whose routing key
/// is the queue's name).
const SUBJECT: &str = "ruststream-subject";

/// A connection to a RabbitMQ server. Cloning shares it.
#[derive(Clone)]
pub struct RabbitBroker {
    inner: Arc<Inner>,
}

struct Inner {
    /// Consumes. Re-established by the client after a connection loss
    /// (auto-recover), as is `publish_conn`.
    conn: Connection,
    /// Publishes (and sends requests): a connection of its own, because the
    /// broker blocks publishing connections under a resource alarm, and
    /// consumers — and their acks — must keep draining queues then.
    publish_conn: Connection,
    /// Publishes, with publisher confirms.
    publisher: lapin::Channel,
    settings: RabbitBrokerBuilder,
    closed: AtomicBool,
    /// Every subscription's ack window, flushed before the connection closes.
    ack_windows: Mutex<Vec<Weak<acks::Acks>>>,
    /// The request channel, started by the first request.
    inbox: tokio::sync::Mutex<Option<Arc<reply::Inbox>>>,
    /// Delay queues declared lately, and when.
    delay_queues: Mutex<HashMap<String, Instant>>,
}

impl std::fmt::Debug for RabbitBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitBroker")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

/// Settings for a [`RabbitBroker`].
///
/// ```no_run
/// use ruststream::rabbitmq::RabbitBroker;
///
/// # async fn run() -> ruststream::Result<()> {
/// let rabbit = RabbitBroker::builder()
///     .exchange("orders")
///     .prefetch(64)
///     .connect("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .await?;
/// # drop(rabbit); Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RabbitBrokerBuilder {
    connection_name: String,
    exchange: String,
    prefetch: u16,
    ack_window: usize,
    queue_expires: Option<Duration>,
    quorum: bool,
    publish_timeout: Duration,
}

impl Default for RabbitBrokerBuilder {
    fn default() -> Self {
        RabbitBrokerBuilder {
            connection_name: "ruststream".to_owned(),
            exchange: "ruststream".to_owned(),
            prefetch: 64,
            ack_window: 32,
            queue_expires: None,
            quorum: false,
            publish_timeout: Duration::from_secs(10),
        }
    }
}

impl RabbitBrokerBuilder {
    /// The connections' name as the broker shows it (default `ruststream`):
    /// the consuming connection has this name, the publishing one this name
    /// with `-publish`.
    pub fn connection_name(mut self, name: impl Into<String>) -> Self {
        self.connection_name = name.into();
        self
    }

    /// The topic exchange subjects are routed through (default `ruststream`).
    pub fn exchange(mut self, name: impl Into<String>) -> Self {
        self.exchange = name.into();
        self
    }

    /// Unacked deliveries one subscription may hold (`basic.qos`, default
    /// 64); never more than the app's job queue can take.
    pub fn prefetch(mut self, messages: u16) -> Self {
        self.prefetch = messages.max(1);
        self
    }

    /// Settled acks sent as one `basic.ack(multiple)` at most (default 32).
    /// Contiguous settled deliveries are acked together when this many wait,
    /// after at most a millisecond otherwise, and before a channel or the
    /// connection closes. `1` acks each delivery on its own.
    pub fn ack_window(mut self, acks: usize) -> Self {
        self.ack_window = acks.max(1);
        self
    }

    /// Delete a queue group's queue after it has had no consumer for this
    /// long (`x-expires`; default: never — the queue outlives its members,
    /// as a durable work queue should).
    pub fn queue_expires(mut self, idle: Duration) -> Self {
        self.queue_expires = Some(idle);
        self
    }

    /// Declare queue groups' queues as quorum queues (replicated; default:
    /// classic durable queues). The broker then counts deliveries: `nack`
    /// is a plain requeue with the broker's delivery count as the attempt,
    /// and a message delivered `max_attempts` times without being settled —
    /// a handler that crashes the process every time — is dead-lettered by
    /// the broker itself (`x-delivery-limit`).
    pub fn quorum_queues(mut self, on: bool) -> Self {
        self.quorum = on;
        self
    }

    /// Deadline of a publish that passes none (default 10 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// Connects to `url` (for example
    /// `amqp://guest:guest@127.0.0.1:5672/%2f`), declares the exchange and
    /// opens the publishing channel with confirms.
    pub async fn connect(self, url: &str) -> Result<RabbitBroker> {
        let unreachable = |err: lapin::Error| {
            Error::Transport(format!("cannot connect to RabbitMQ at {url}: {err}").into())
        };
        let open = |name: String| async move {
            let properties = ConnectionProperties::default()
                .with_connection_name(name.into())
                .enable_auto_recover();
            let conn = Connection::connect(url, properties)
                .await
                .map_err(unreachable)?;
            watch_connection(&conn);
            Ok::<_, Error>(conn)
        };
        let conn = open(self.connection_name.clone()).await?;
        let publish_conn = open(format!("{}-publish", self.connection_name)).await?;
        let publisher = publish_conn.create_channel().await.map_err(transport)?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(transport)?;
        publisher
            .exchange_declare(
                self.exchange.as_str().into(),
                lapin::ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(transport)?;
        Ok(RabbitBroker {
            inner: Arc::new(Inner {
                conn,
                publish_conn,
                publisher,
                settings: self,
                closed: AtomicBool::new(false),
                ack_windows: Mutex::new(Vec::new()),
                inbox: tokio::sync::Mutex::new(None),
                delay_queues: Mutex::new(HashMap::new()),
            }),
        })
    }
}

/// Logs and counts connection events: losses, recoveries, blocking.
fn watch_connection(conn: &Connection) {
    let mut events = conn.events_listener();
    tokio::spawn(async move {
        use futures_util::StreamExt;
        while let Some(event) = events.next().await {
            let name = match &event {
                lapin::Event::Connected => "connected",
                lapin::Event::Error(err) => {
                    tracing::warn!(error = %err, "RabbitMQ connection error; recovering");
                    "disconnected"
                }
                lapin::Event::ConnectionBlocked(reason) => {
                    tracing::warn!(%reason, "RabbitMQ blocked the connection");
                    "blocked"
                }
                lapin::Event::ConnectionUnblocked => "unblocked",
                _ => continue,
            };
            crate::metrics::connection_event("rabbitmq", name);
        }
    });
}

fn transport(err: lapin::Error) -> Error {
    Error::Transport(err.into())
}

impl RabbitBroker {
    /// Connects with default settings.
    pub async fn connect(url: &str) -> Result<RabbitBroker> {
        RabbitBrokerBuilder::default().connect(url).await
    }

    /// Settings for a new connection.
    pub fn builder() -> RabbitBrokerBuilder {
        RabbitBrokerBuilder::default()
    }

    fn ensure_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("RabbitMQ connection is closed"));
        }
        Ok(())
    }

    /// Publishes `payload` to `exchange` with `routing_key` and waits for
    /// the publisher confirm until `deadline`. A publish through the default
    /// exchange goes straight to a queue that must exist (a nack or retry
    /// copy): it is mandatory, and an unroutable one is an error, not a
    /// silent drop. Replies to direct reply-to are not.
    pub(crate) async fn publish_to(
        &self,
        exchange: &str,
        routing_key: &str,
        payload: &[u8],
        properties: BasicProperties,
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.ensure_open()?;
        let to_queue = exchange.is_empty() && !routing_key.starts_with(reply::REPLY_TO);
        let deadline =
            deadline.unwrap_or_else(|| Instant::now() + self.inner.settings.publish_timeout);
        let publisher = &self.inner.publisher;
        let publish = async {
            loop {
                let sent = async {
                    let confirm = publisher
                        .basic_publish(
                            exchange.into(),
                            routing_key.into(),
                            BasicPublishOptions {
                                mandatory: to_queue,
                                ..Default::default()
                            },
                            payload,
                            properties.clone(),
                        )
                        .await?;
                    confirm.await
                };
                match sent.await {
                    Ok(Confirmation::Ack(Some(_)) | Confirmation::Nack(Some(_))) => {
                        return Err(Error::Transport(
                            format!("RabbitMQ has no queue `{routing_key}` to take the message")
                                .into(),
                        ));
                    }
                    Ok(Confirmation::Nack(_)) => {
                        return Err(Error::Transport(
                            "RabbitMQ refused the message (publisher confirm nack)".into(),
                        ));
                    }
                    Ok(_) => return Ok(()),
                    // Caught by a connection loss: send it again once the
                    // channel is back (at-least-once: the broker may have it
                    // twice if only the confirm was lost).
                    Err(err) => publisher.wait_for_recovery(err).await.map_err(transport)?,
                }
            }
        };
        match tokio::time::timeout_at(deadline, publish).await {
            Ok(result) => result,
            Err(_) => {
                crate::metrics::deadline_exceeded("rabbitmq");
                Err(Error::DeadlineExceeded(
                    "RabbitMQ did not confirm the publish before the deadline",
                ))
            }
        }
    }
}

/// The AMQP properties of `message`: persistent, headers (plus `extra`),
/// key, correlation id and reply address.
pub(crate) fn properties(message: &Message, extra: &[(&str, String)]) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in message.headers().iter() {
        headers.insert(name.into(), long(value));
    }
    if let Some(key) = message.key() {
        headers.insert(KEY.into(), long(key));
    }
    for (name, value) in extra {
        headers.insert((*name).into(), long(value));
    }
    let mut properties = BasicProperties::default()
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(id) = message.correlation_id() {
        properties = properties.with_correlation_id(ShortString::from(id.as_str()));
    }
    if let Some(reply) = message.reply_to() {
        properties = properties.with_reply_to(ShortString::from(reply.as_str()));
    }
    properties
}

impl RabbitBroker {
    /// The request channel, started on first use.
    async fn inbox(&self) -> Result<Arc<reply::Inbox>> {
        let mut inbox = self.inner.inbox.lock().await;
        if let Some(inbox) = inbox.as_ref().filter(|inbox| inbox.alive()) {
            return Ok(Arc::clone(inbox));
        }
        let started = Arc::new(reply::Inbox::start(&self.inner.publish_conn).await?);
        *inbox = Some(Arc::clone(&started));
        Ok(started)
    }

    /// Forgets `stale` (its reply consumer is gone on the broker), unless
    /// another request already did, and closes its channel, which ends its
    /// dispatch task; the next request starts a new inbox.
    async fn discard_inbox(&self, stale: &Arc<reply::Inbox>) {
        let mut inbox = self.inner.inbox.lock().await;
        if inbox
            .as_ref()
            .is_some_and(|current| Arc::ptr_eq(current, stale))
        {
            *inbox = None;
            let channel = stale.channel().clone();
            tokio::spawn(async move { close_channel(channel, "reply consumer lost").await });
        }
    }
}

/// The kinds of AMQP exchange (see [`RabbitBroker::declare_exchange`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Routes on the exact routing key.
    Direct,
    /// Routes on routing-key patterns (`*` one word, `#` the rest).
    Topic,
    /// Every bound queue or exchange gets every message.
    Fanout,
    /// Routes on header values (`x-match` = `all` or `any` in the binding).
    Headers,
}

impl From<ExchangeKind> for lapin::ExchangeKind {
    fn from(kind: ExchangeKind) -> Self {
        match kind {
            ExchangeKind::Direct => lapin::ExchangeKind::Direct,
            ExchangeKind::Topic => lapin::ExchangeKind::Topic,
            ExchangeKind::Fanout => lapin::ExchangeKind::Fanout,
            ExchangeKind::Headers => lapin::ExchangeKind::Headers,
        }
    }
}

impl RabbitBroker {
    /// Declares a durable exchange `name` of `kind` (fine if it exists with
    /// the same kind), for example one other systems publish to.
    ///
    /// ```no_run
    /// use ruststream::rabbitmq::{ExchangeKind, RabbitBroker};
    ///
    /// # async fn run(rabbit: RabbitBroker) -> ruststream::Result<()> {
    /// // Everything published to the legacy fan-out exchange reaches
    /// // ruststream subscribers, by its routing key as the subject.
    /// rabbit.declare_exchange("legacy.events", ExchangeKind::Fanout).await?;
    /// rabbit.bind_exchange("legacy.events", "", &[]).await?;
    /// # Ok(()) }
    /// ```
    pub async fn declare_exchange(&self, name: &str, kind: ExchangeKind) -> Result<()> {
        let admin = self.admin_channel().await?;
        let declared = admin
            .exchange_declare(
                name.into(),
                kind.into(),
                ExchangeDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|err| {
                Error::Config(format!(
                    "cannot declare RabbitMQ exchange `{name}` as {kind:?}: {err}"
                ))
            });
        close_admin(admin).await;
        declared
    }

    /// Binds the exchange `source` into ruststream's exchange, so what is
    /// published there reaches subscribers whose subject matches the
    /// message's routing key. `binding_key` filters on a direct or topic
    /// source (ignored by fan-out); `headers` are the binding arguments of a
    /// headers source (for example `[("x-match", "all"), ("region", "eu")]`).
    pub async fn bind_exchange(
        &self,
        source: &str,
        binding_key: &str,
        headers: &[(&str, &str)],
    ) -> Result<()> {
        let mut arguments = FieldTable::default();
        for (name, value) in headers {
            arguments.insert((*name).into(), long(value));
        }
        let admin = self.admin_channel().await?;
        let bound = admin
            .exchange_bind(
                self.inner.settings.exchange.as_str().into(),
                source.into(),
                binding_key.into(),
                lapin::options::ExchangeBindOptions::default(),
                arguments,
            )
            .await
            .map_err(|err| {
                Error::Config(format!(
                    "cannot bind RabbitMQ exchange `{source}` into `{}`: {err}",
                    self.inner.settings.exchange
                ))
            });
        close_admin(admin).await;
        bound
    }

    /// A short-lived channel for declarations: a refused one closes its
    /// channel, which must not be the publishing channel.
    async fn admin_channel(&self) -> Result<lapin::Channel> {
        self.ensure_open()?;
        self.inner.conn.create_channel().await.map_err(transport)
    }

    /// The queue that holds `queue`'s retries of `delay` until it has passed,
    /// then dead-letters them back into `queue` through the default
    /// exchange. One queue per delay: RabbitMQ expires messages only at a
    /// queue's head, so mixed delays would wait for each other. Declared
    /// before each use, which renews its lease: it goes away a minute after
    /// its last message is due. Declarations are remembered for
    /// [`REDECLARE_AFTER`], well inside that lease, so a burst of retries
    /// opens no channel each.
    async fn delay_queue(&self, queue: &str, delay: Duration) -> Result<String> {
        let ms = u32::try_from(delay.as_millis())
            .ok()
            .filter(|ms| *ms <= MAX_HELD_DELAY_MS)
            .ok_or_else(|| Error::Config(format!("a delay of {delay:?} is too long to hold")))?;
        let name = format!("{queue}.delay.{ms}");
        let fresh = |at: &Instant| at.elapsed() < REDECLARE_AFTER;
        if self.declared_delays().get(&name).is_some_and(fresh) {
            return Ok(name);
        }
        let mut arguments = FieldTable::default();
        arguments.insert("x-dead-letter-exchange".into(), long(""));
        arguments.insert("x-dead-letter-routing-key".into(), long(queue));
        arguments.insert(
            "x-expires".into(),
            AMQPValue::LongUInt(ms.saturating_add(60_000)),
        );
        let admin = self.admin_channel().await?;
        let declared = admin
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                arguments,
            )
            .await
            .map_err(transport);
        close_admin(admin).await;
        declared?;
        let mut declared = self.declared_delays();
        declared.retain(|_, at| fresh(at));
        declared.insert(name.clone(), Instant::now());
        Ok(name)
    }

    fn declared_delays(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.inner
            .delay_queues
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes `message` (to be delivered as `subject`) into `queue`'s
    /// delay queue; the broker moves it into `queue` once `delay` has passed.
    pub(crate) async fn publish_delayed(
        &self,
        queue: &str,
        subject: &str,
        message: &Message,
        delay: Duration,
    ) -> Result<()> {
        let delay_queue = self.delay_queue(queue, delay).await?;
        let properties = properties(message, &[(SUBJECT, subject.to_owned())])
            .with_expiration(ShortString::from(delay.as_millis().to_string()));
        let published = self
            .publish_to("", &delay_queue, message.payload(), properties, None)
            .await;
        if published.is_err() {
            // Deleted behind our back? Declare it again next time.
            self.declared_delays().remove(&delay_queue);
        }
        published
    }
}

async fn close_admin(channel: lapin::Channel) {
    close_channel(channel, "declared").await;
}

/// Closes `channel`. One caught by a connection loss is closed once the
/// client has re-created it: left alone, it would come back — with its
/// consumer, holding up to `prefetch` messages nobody reads.
pub(crate) async fn close_channel(channel: lapin::Channel, why: &str) {
    if let Err(err) = channel.close(200, why.into()).await
        && channel.wait_for_recovery(err).await.is_ok()
    {
        let _ = channel.close(200, why.into()).await;
    }
}

fn long(value: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(value.as_bytes().to_vec()))
}

/// An AMQP topic binding key for a subject pattern: `>` becomes `#`.
fn binding_key(subject: &str) -> String {
    subject
        .split('.')
        .map(|word| if word == ">" { "#" } else { word })
        .collect::<Vec<_>>()
        .join(".")
}

impl Broker for RabbitBroker {
    type Subscription = RabbitSubscription;

    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    async fn subscribe(&self, options: SubscribeOptions) -> Result<RabbitSubscription> {
        self.ensure_open()?;
        RabbitSubscription::open(self.clone(), options).await
    }

    async fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> Result<()> {
        // A reply to a direct reply-to address goes through the default
        // exchange, straight to the requester's channel.
        let exchange = if subject.starts_with(reply::REPLY_TO) {
            String::new()
        } else {
            self.inner.settings.exchange.clone()
        };
        let properties = properties(&message, &[]);
        self.publish_to(&exchange, subject, message.payload(), properties, deadline)
            .await
    }

    /// Closes the connection: unacked deliveries go back to their queues;
    /// later calls fail with `Error::Closed`. Closing twice is fine.
    async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let windows: Vec<_> = self
            .inner
            .ack_windows
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .filter_map(|w| w.upgrade())
            .collect();
        for window in windows {
            if let Err(err) = window.flush().await {
                tracing::warn!(error = %err, "RabbitMQ acks at close failed; the broker redelivers");
            }
        }
        for conn in [&self.inner.publish_conn, &self.inner.conn] {
            if let Err(err) = conn.close(200, "ruststream closing".into()).await {
                tracing::debug!(error = %err, "RabbitMQ close");
            }
        }
        Ok(())
    }
}
