//! The Kafka binding (feature `kafka`), on `rdkafka` (librdkafka).
//!
//! * A subject is a topic. Publishing waits for the delivery report, so
//!   `Ok` means the record is stored (with librdkafka's default
//!   `acks=all`). A message's key is the record key; a message without one
//!   goes to partition 0 unless [`spread_keyless`](KafkaBrokerBuilder::spread_keyless)
//!   is set, so keyless messages keep their order.
//! * A queue group is a consumer group, one per topic: group `billing` on
//!   topic `orders` is the Kafka group `billing@orders`. A fan-out
//!   subscription joins no group: it reads every partition of the topic
//!   itself, from where the topic ended when it subscribed, and commits
//!   nothing.
//! * Offsets follow acks: a group member commits, per partition, only the
//!   prefix of records that are all settled, however out of order handlers
//!   finish. Commits are coalesced (by count and time), and the settled
//!   prefix is committed synchronously when a partition is revoked and
//!   when the broker closes.
//! * `nack` copies the record, with its attempt + 1, to the group's retry
//!   topic (`<topic>.<group>.retry`, read by the same members) and settles
//!   the original, so the partition never stalls. `retry_after` sends the
//!   copy the same way with the time it is due; the member that reads it
//!   holds it (pausing that retry partition) until then, and it survives a
//!   crash. `reject` copies the record to the dead-letter topic with the
//!   reason, the original topic, partition and offset.
//! * Records a crashed or departed member had handed out come back from
//!   the committed offset. Every commit's metadata records how far the
//!   member may have handed records out (at most 512 past the record at
//!   hand, moved ahead by a confirmed commit); after a crash the next
//!   owner hands that stretch out one record at a time, each counted in a
//!   confirmed commit before its handler starts, so a record that keeps
//!   crashing its consumer reaches `max_attempts` and is dead-lettered
//!   (see `commits.rs`).
//! * Request/reply: each broker reads replies from a reply topic of its
//!   own, matched by correlation id.
//!
//! No wildcards. Topics are created when missing (by the broker's
//! auto-creation, else through the admin API).

mod builder;
mod commits;
mod delivery;
mod flow;
mod group;
mod offsets;
mod record;
mod reply;
mod subscription;
mod topics;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rdkafka::config::FromClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use self::builder::KafkaBrokerBuilder;
pub use self::delivery::KafkaDelivery;
pub use self::record::{ORIGINAL_OFFSET, ORIGINAL_PARTITION};
pub use self::subscription::KafkaSubscription;
use crate::binding::{Broker, Requester, SubscribeOptions};
use crate::{Envelope, Error, Message, Result};

/// The `rdkafka` crate this binding is built on, for its types
/// (`ClientConfig` properties are passed as strings through
/// [`KafkaBrokerBuilder::property`]).
pub use rdkafka;

/// A connection to a Kafka cluster: one producer shared by every publish,
/// and a consumer per subscription. Cloning shares it.
#[derive(Clone)]
pub struct KafkaBroker {
    inner: Arc<Inner>,
}

struct Inner {
    bootstrap: String,
    settings: KafkaBrokerBuilder,
    producer: FutureProducer,
    closed: AtomicBool,
    /// Cancelled at close: subscriptions end.
    closing: CancellationToken,
    /// The subscriptions' commit state, flushed at close.
    subscriptions: Mutex<Vec<Weak<subscription::Shared>>>,
    /// The reply inbox, started by the first request.
    inbox: tokio::sync::Mutex<Option<Arc<reply::Inbox>>>,
    /// Hand-out commits waiting for the group's answer: close waits for
    /// them, so none outlives the broker (or the cluster it talks to).
    handouts: TaskTracker,
}

impl std::fmt::Debug for KafkaBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaBroker")
            .field("bootstrap", &self.inner.bootstrap)
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl KafkaBrokerBuilder {
    /// Connects to the cluster at `bootstrap` (`host:port[,host:port…]`).
    /// A cluster that does not answer within the metadata timeout is an
    /// [`Error::Transport`] naming the address.
    pub async fn connect(self, bootstrap: &str) -> Result<KafkaBroker> {
        let mut config = self.client_config(bootstrap);
        config.set(
            "message.timeout.ms",
            self.publish_timeout.as_millis().max(1).to_string(),
        );
        let producer = FutureProducer::from_config(&config).map_err(config_error)?;
        let broker = KafkaBroker {
            inner: Arc::new(Inner {
                bootstrap: bootstrap.to_owned(),
                settings: self,
                producer,
                closed: AtomicBool::new(false),
                closing: CancellationToken::new(),
                subscriptions: Mutex::new(Vec::new()),
                inbox: tokio::sync::Mutex::new(None),
                handouts: TaskTracker::new(),
            }),
        };
        let probe = broker.clone();
        let timeout = broker.inner.settings.metadata_timeout;
        blocking(move || {
            probe
                .inner
                .producer
                .client()
                .fetch_metadata(None, timeout)
                .map(drop)
        })
        .await
        .map_err(|err| {
            Error::Transport(format!("cannot connect to Kafka at {bootstrap}: {err}").into())
        })?;
        Ok(broker)
    }
}

fn config_error(err: KafkaError) -> Error {
    Error::Config(format!("Kafka client configuration: {err}"))
}

/// Runs a blocking librdkafka call off the async threads.
async fn blocking<T: Send + 'static>(
    call: impl FnOnce() -> std::result::Result<T, KafkaError> + Send + 'static,
) -> std::result::Result<T, KafkaError> {
    match tokio::task::spawn_blocking(call).await {
        Ok(result) => result,
        Err(_) => Err(KafkaError::Canceled),
    }
}

impl KafkaBroker {
    /// Connects with default settings.
    ///
    /// ```no_run
    /// use ruststream::kafka::KafkaBroker;
    ///
    /// # async fn run() -> ruststream::Result<()> {
    /// let kafka = KafkaBroker::connect("127.0.0.1:9092").await?;
    /// # drop(kafka); Ok(()) }
    /// ```
    pub async fn connect(bootstrap: &str) -> Result<KafkaBroker> {
        KafkaBrokerBuilder::default().connect(bootstrap).await
    }

    /// Settings for a new connection.
    pub fn builder() -> KafkaBrokerBuilder {
        KafkaBrokerBuilder::default()
    }

    fn ensure_open(&self) -> Result<()> {
        if self.inner.closed.load(Ordering::Acquire) {
            return Err(Error::Closed("Kafka connection is closed"));
        }
        Ok(())
    }

    pub(crate) fn settings(&self) -> &KafkaBrokerBuilder {
        &self.inner.settings
    }

    pub(crate) fn bootstrap(&self) -> &str {
        &self.inner.bootstrap
    }

    pub(crate) fn closing(&self) -> &CancellationToken {
        &self.inner.closing
    }

    pub(crate) fn producer(&self) -> &FutureProducer {
        &self.inner.producer
    }

    pub(crate) fn handouts(&self) -> &TaskTracker {
        &self.inner.handouts
    }

    /// Produces `message` to `topic` with `extra` bookkeeping headers and
    /// waits for its delivery report until `deadline`.
    pub(crate) async fn produce(
        &self,
        topic: &str,
        message: &Message,
        extra: &[(&str, &str)],
        deadline: Instant,
    ) -> Result<()> {
        let headers = record::headers(message, extra);
        let payload: &[u8] = message.payload();
        let mut record = FutureRecord::<[u8], [u8]>::to(topic)
            .payload(payload)
            .headers(headers);
        let key = message.key().map(|k| k.as_str().as_bytes());
        match key {
            Some(key) => record = record.key(key),
            None if !self.inner.settings.spread_keyless => record = record.partition(0),
            None => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let send = self.inner.producer.send(record, left);
        match tokio::time::timeout_at(deadline, send).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((err, _))) => Err(produce_error(topic, err)),
            Err(_) => Err(deadline_exceeded()),
        }
    }

    /// Keeps `shared` to flush its commits at close.
    fn track(&self, shared: &Arc<subscription::Shared>) {
        let mut subs = self
            .inner
            .subscriptions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        subs.retain(|s| s.strong_count() > 0);
        subs.push(Arc::downgrade(shared));
    }

    /// The reply inbox, started on first use.
    async fn inbox(&self) -> Result<Arc<reply::Inbox>> {
        let mut inbox = self.inner.inbox.lock().await;
        if let Some(inbox) = &*inbox {
            return Ok(Arc::clone(inbox));
        }
        let started = reply::Inbox::start(self).await?;
        *inbox = Some(Arc::clone(&started));
        Ok(started)
    }
}

fn deadline_exceeded() -> Error {
    crate::metrics::deadline_exceeded("kafka");
    Error::DeadlineExceeded("Kafka did not confirm the record before the deadline")
}

fn produce_error(topic: &str, err: KafkaError) -> Error {
    match err.rdkafka_error_code() {
        Some(RDKafkaErrorCode::QueueFull | RDKafkaErrorCode::MessageTimedOut) => {
            deadline_exceeded()
        }
        Some(RDKafkaErrorCode::MessageSizeTooLarge) => Error::StructuralLimit(format!(
            "the record for topic `{topic}` is larger than Kafka accepts (`message.max.bytes`): {err}"
        )),
        _ => {
            Error::Transport(format!("Kafka refused the record for topic `{topic}`: {err}").into())
        }
    }
}

impl Broker for KafkaBroker {
    fn as_requester(&self) -> Option<&dyn crate::binding::DynRequester> {
        Some(self)
    }

    type Subscription = KafkaSubscription;

    fn name(&self) -> &'static str {
        "kafka"
    }

    fn host(&self) -> Option<String> {
        Some(self.bootstrap().to_owned())
    }

    async fn subscribe(&self, options: SubscribeOptions) -> Result<KafkaSubscription> {
        self.ensure_open()?;
        if options.subject.contains(['*', '>']) {
            return Err(Error::Config(format!(
                "Kafka topics have no wildcards: `{}` is not a topic name",
                options.subject
            )));
        }
        let subscription = KafkaSubscription::open(self.clone(), options).await?;
        self.track(subscription.shared());
        Ok(subscription)
    }

    /// Produces the record and waits for its delivery report until the
    /// deadline: `Ok` means Kafka stored it.
    async fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> Result<()> {
        self.ensure_open()?;
        let deadline =
            deadline.unwrap_or_else(|| Instant::now() + self.inner.settings.publish_timeout);
        self.produce(subject, &message, &[], deadline).await
    }

    /// Commits what every subscription settled, flushes the producer and
    /// ends the subscriptions. Later calls fail with `Error::Closed`.
    async fn close(&self) -> Result<()> {
        if self.inner.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.inner.closing.cancel();
        // Subscriptions stop asking for hand-out commits once `closing` is
        // cancelled; the ones asked for already get their answer (bounded:
        // a cluster that does not answer is left behind).
        self.inner.handouts.close();
        let answered = self.inner.settings.metadata_timeout;
        if tokio::time::timeout(answered, self.inner.handouts.wait())
            .await
            .is_err()
        {
            tracing::warn!("Kafka: hand-out commits still unanswered at close");
        }
        let subs: Vec<_> = {
            let subs = self
                .inner
                .subscriptions
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            subs.iter().filter_map(Weak::upgrade).collect()
        };
        let producer = self.inner.producer.clone();
        let flushed = blocking(move || {
            for sub in subs {
                sub.commit_now();
            }
            producer.flush(Duration::from_secs(5))
        })
        .await;
        if let Some(inbox) = self.inner.inbox.lock().await.take() {
            inbox.stop();
        }
        flushed
            .map_err(|err| Error::Transport(format!("Kafka producer flush at close: {err}").into()))
    }
}

impl Requester for KafkaBroker {
    /// Publishes the request with the broker's reply topic and a fresh
    /// correlation id, and waits for the reply that carries it. Kafka
    /// cannot tell that nobody reads a topic: such a request times out.
    async fn send_request(
        &self,
        subject: &str,
        message: Message,
        timeout: Duration,
    ) -> Result<Envelope> {
        self.ensure_open()?;
        let deadline = Instant::now() + timeout;
        let inbox = self.inbox().await?;
        let (id, reply) = inbox.expect();
        let message = message
            .with_reply_to(inbox.topic())
            .with_correlation_id(id.clone());
        if let Err(err) = self.produce(subject, &message, &[], deadline).await {
            inbox.forget(&id);
            return Err(err);
        }
        match tokio::time::timeout_at(deadline, reply).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(Error::Closed("Kafka reply inbox stopped")),
            Err(_) => {
                inbox.forget(&id);
                Err(Error::Timeout(timeout))
            }
        }
    }
}
