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
mod builder;
mod delayed;
mod delivery;
mod exchanges;
mod reply;
mod subscription;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use lapin::options::BasicPublishOptions;
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Confirmation, Connection};
use tokio::time::Instant;

pub use self::builder::RabbitBrokerBuilder;
pub use self::delivery::RabbitDelivery;
pub use self::exchanges::ExchangeKind;
pub use self::subscription::RabbitSubscription;
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
    /// `host:port` of the URL it connected with.
    host: String,
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
    fn as_requester(&self) -> Option<&dyn crate::binding::DynRequester> {
        Some(self)
    }

    type Subscription = RabbitSubscription;

    fn name(&self) -> &'static str {
        "rabbitmq"
    }

    fn host(&self) -> Option<String> {
        Some(self.inner.host.clone())
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
