//! The MQTT binding (feature `mqtt`): MQTT 5 on [`rumqttc`], tested against
//! Mosquitto 2 (which speaks MQTT 5, 3.1.1 and 3.1; this binding uses 5 for
//! user properties, response topics, shared subscriptions, session expiry
//! and receive maximum).
//!
//! * Subjects are MQTT topics as they are: `/` separates levels, `+`
//!   matches one level and `#` the rest. A queue group is a shared
//!   subscription, `$share/<group>/<subject>`: the broker gives each message
//!   to one member.
//! * Every subscription is a client connection (and a session) of its own,
//!   as `<client id>-<hash of group and subject>`; with
//!   [`MqttBrokerBuilder::client_id`] stable and a session expiry (default
//!   one hour), the broker keeps the subscription and the QoS 1/2 messages
//!   published while the app is down, and hands them over when it comes
//!   back.
//! * QoS 1 with manual acknowledgement (default): the PUBACK goes out only
//!   when the handler's outcome says ack, so a process that dies before the
//!   ack gets the message again (DUP: attempt + 1) when its session resumes.
//!   QoS 2 acknowledges with PUBREC the same way (but see the guide's known
//!   limits: `rumqttc` forgets QoS 2 handshakes across reconnects); QoS 0
//!   (per subscriber:
//!   [`MqttBrokerBuilder::subscription_qos`]) has no acknowledgement at all,
//!   so a crash loses what was in hand. `nack` works the same at every QoS.
//! * `nack`: MQTT has no negative acknowledgement and redelivers only when a
//!   session resumes, so a copy with attempt + 1 (the `ruststream-redelivery`
//!   user property) is published at QoS 1 to the subscription's private retry
//!   topic (`ruststream/retry/…`, shared by its queue group), and once the
//!   broker confirmed it the original is acked. The copy lives in the
//!   broker's session like any message: it survives a restart of the app.
//!   `reject` publishes to the dead-letter topic with the reason, the
//!   original subject and the attempt (`ruststream-error`,
//!   `ruststream-original-subject`, `ruststream-attempt`), then acks.
//! * Receive flow: the broker never has more than the receive maximum
//!   ([`MqttBrokerBuilder::receive_maximum`]) unacked QoS 1/2 messages out
//!   with a subscription, and the subscription buffers at most that many
//!   (and as many QoS 0 ones, in a room of their own); a PAUSED receive
//!   flow hands nothing out, so the broker stops there. QoS 0 has no flow
//!   control in MQTT: a full buffer stops reading the socket, and past a
//!   quarter of the keep-alive QoS 0 messages are dropped (counted as
//!   `slow_consumer`) until it has room, so the keep-alive goes on.
//!   While the runtime waits for a message, its loop polls the
//!   subscription's event loop itself (no hand-off between tasks); every
//!   connection sets `TCP_NODELAY`.
//! * Headers are MQTT 5 user properties; the key travels as the
//!   `ruststream-key` user property, the reply address as the response
//!   topic and the correlation id as the correlation data. Request/reply
//!   uses them: the reply comes back on this broker's own response topic.
//! * Publishes wait for the broker's PUBACK (QoS 1; PUBCOMP for QoS 2)
//!   until the deadline: `Ok` means the broker has the message.
//!   [`MqttBroker::publish_with`] picks the QoS and the retain flag.
//! * A lost connection is re-established with backoff
//!   ([`MqttBrokerBuilder::reconnect_backoff`]); the session resumes, and
//!   where the broker lost it the subscriptions are made again. Publishes
//!   caught by the outage are sent again once it is back (at-least-once:
//!   the broker may get one twice); acks of deliveries from the broken
//!   connection are not sent — the broker sends those messages again.
//!
//! ```no_run
//! use ruststream::prelude::*;
//! use ruststream::mqtt::MqttBroker;
//!
//! #[subscriber("sensors/+/temperature", queue_group = "ingest")]
//! async fn record(celsius: f64) {
//!     println!("{celsius} °C");
//! }
//!
//! # async fn run() -> ruststream::Result<()> {
//! let mqtt = MqttBroker::builder()
//!     .client_id("ingest")
//!     .connect("mqtt://127.0.0.1:1883")
//!     .await?;
//! App::new().broker(mqtt).subscriber(record).run().await
//! # }
//! ```

mod builder;
mod connection;
mod convert;
mod delivery;
mod drive;
mod pump;
mod reply;
mod room;
mod subscription;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

use rumqttc::v5::mqttbytes::v5::Filter;
use tokio::time::Instant;

use self::builder::Address;
pub use self::builder::MqttBrokerBuilder;
use self::connection::{Connection, Settings};
pub use self::delivery::MqttDelivery;
pub use self::subscription::MqttSubscription;
use crate::binding::{Broker, SubscribeOptions};
use crate::{Error, Message, Result};
/// MQTT's quality of service levels, for [`MqttBrokerBuilder`] and
/// [`MqttBroker::publish_with`].
pub use rumqttc::v5::mqttbytes::QoS;

/// A connection to an MQTT broker (MQTT 5). Cloning shares it.
#[derive(Clone)]
pub struct MqttBroker {
    inner: Arc<Inner>,
}

struct Inner {
    settings: MqttBrokerBuilder,
    address: Address,
    client_id: String,
    /// Publishes, and receives replies on `reply_topic`.
    publisher: Arc<Connection>,
    inbox: Arc<reply::Inbox>,
    reply_topic: String,
    closed: AtomicBool,
    /// Every subscription's connection, closed with the broker.
    subscriptions: Mutex<Vec<Weak<Connection>>>,
    /// Subscription client ids handed out, to keep two subscriptions of the
    /// same group and subject apart.
    client_ids: Mutex<HashMap<u32, u32>>,
}

impl std::fmt::Debug for MqttBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MqttBroker")
            .field("client_id", &self.inner.client_id)
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl MqttBroker {
    /// Connects with default settings.
    pub async fn connect(url: &str) -> Result<MqttBroker> {
        MqttBrokerBuilder::default().connect(url).await
    }

    /// Settings for a new connection.
    pub fn builder() -> MqttBrokerBuilder {
        MqttBrokerBuilder::default()
    }

    async fn open(settings: MqttBrokerBuilder, address: Address) -> Result<MqttBroker> {
        let client_id = settings
            .client_id
            .clone()
            .unwrap_or_else(|| format!("ruststream-{:016x}", random()));
        let publisher_id = format!("{client_id}-pub");
        let reply_topic = format!("ruststream/reply/{publisher_id}");
        let mut options = settings.options(&address, &publisher_id);
        // Replies only: nothing of this connection's session is worth
        // keeping after it.
        options.set_clean_start(true);
        options.set_session_expiry_interval(Some(0));
        let inbox = Arc::new(reply::Inbox::default());
        let publisher = Connection::open(
            Settings {
                options,
                filters: vec![Filter::new(reply_topic.clone(), QoS::AtLeastOnce)],
                backoff: settings.backoff(),
                label: format!("publisher {publisher_id}"),
            },
            settings.publish_window,
            Arc::clone(&inbox),
        )
        .await?;
        Ok(MqttBroker {
            inner: Arc::new(Inner {
                settings,
                address,
                client_id,
                publisher,
                inbox,
                reply_topic,
                closed: AtomicBool::new(false),
                subscriptions: Mutex::new(Vec::new()),
                client_ids: Mutex::new(HashMap::new()),
            }),
        })
    }

    /// The client id this app connects as (subscriptions add a suffix).
    pub fn client_id(&self) -> &str {
        &self.inner.client_id
    }

    fn ensure_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("MQTT connection is closed"));
        }
        Ok(())
    }

    /// Publishes `message` to `topic` with `qos` and the `retain` flag, and
    /// waits until `deadline` (default: the publish timeout) for the broker's
    /// confirmation: PUBACK for QoS 1, PUBCOMP for QoS 2, the write for QoS 0.
    pub async fn publish_with(
        &self,
        topic: &str,
        message: Message,
        qos: QoS,
        retain: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.publish_raw(topic, &message, &[], qos, retain, deadline)
            .await
    }

    pub(super) async fn publish_raw(
        &self,
        topic: &str,
        message: &Message,
        extra: &[(&str, String)],
        qos: QoS,
        retain: bool,
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.ensure_open()?;
        let deadline =
            deadline.unwrap_or_else(|| Instant::now() + self.inner.settings.publish_timeout);
        let properties = convert::properties(message, extra);
        self.inner
            .publisher
            .publish(
                topic,
                qos,
                retain,
                message.payload().clone(),
                properties,
                deadline,
            )
            .await
    }

    /// `rumqttc` options for a connection as `client_id`.
    fn options(&self, client_id: &str) -> rumqttc::v5::MqttOptions {
        self.inner.settings.options(&self.inner.address, client_id)
    }

    /// `<client id>-<hash>`, and `-<n>` for the n-th subscription of the
    /// same group and subject on this broker.
    fn subscription_client_id(&self, hash: u32) -> String {
        let mut ids = self
            .inner
            .client_ids
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let seen = ids.entry(hash).or_insert(0);
        *seen += 1;
        match *seen {
            1 => format!("{}-{hash:08x}", self.inner.client_id),
            n => format!("{}-{hash:08x}-{n}", self.inner.client_id),
        }
    }

    fn track(&self, conn: &Arc<Connection>) {
        let mut subs = self
            .inner
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        subs.retain(|sub| sub.strong_count() > 0);
        subs.push(Arc::downgrade(conn));
    }
}

/// A random number for client ids (no dependency on a random crate: the
/// hasher's per-process keys, the time and a counter).
fn random() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::AtomicU64;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(NEXT.fetch_add(1, Ordering::Relaxed));
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

impl Broker for MqttBroker {
    type Subscription = MqttSubscription;

    fn name(&self) -> &'static str {
        "mqtt"
    }

    fn host(&self) -> Option<String> {
        Some(format!(
            "{}:{}",
            self.inner.address.host, self.inner.address.port
        ))
    }

    fn as_requester(&self) -> Option<&dyn crate::binding::DynRequester> {
        Some(self)
    }

    /// Connects the subscription's client and waits for the SUBACK: what is
    /// published afterwards reaches it.
    async fn subscribe(&self, options: SubscribeOptions) -> Result<MqttSubscription> {
        self.ensure_open()?;
        MqttSubscription::open(self.clone(), options).await
    }

    /// Publishes with the builder's QoS (default 1), not retained.
    async fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let qos = self.inner.settings.publish_qos;
        self.publish_raw(subject, &message, &[], qos, false, deadline)
            .await
    }

    /// Sends the acks already made and DISCONNECT on every connection; the
    /// subscriptions' sessions stay for their expiry, so what was not acked
    /// comes back to the next run. Later calls fail with `Error::Closed`;
    /// closing twice is fine.
    async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let subs: Vec<_> = self
            .inner
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .filter_map(|sub| sub.upgrade())
            .collect();
        for sub in subs {
            sub.close().await;
        }
        self.inner.publisher.close().await;
        Ok(())
    }
}
