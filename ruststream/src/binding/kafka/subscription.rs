//! One Kafka subscription: a consumer of its own, in the queue group's
//! consumer group (or on its own, for fan-out), handing records out one
//! at a time from librdkafka's bounded prefetch queue.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use rdkafka::config::FromClientConfigAndContext;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message as _, Offset, TopicPartitionList};
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

use super::commits::{self, Gate};
use super::delivery::{At, KafkaDelivery};
use super::flow::KafkaFlow;
use super::group::GroupContext;
use super::offsets::PartitionAcks;
use super::topics::topic_safe;
use super::{KafkaBroker, config_error, record};
use crate::binding::{SubscribeOptions, Subscription};
use crate::ingress::ReceiveFlow;
use crate::{Envelope, Error, Result, Text};

/// A subscription's consumer.
pub(crate) type Consumer_ = StreamConsumer<GroupContext>;

static NEXT_FAN_OUT: AtomicU64 = AtomicU64::new(1);

/// How long a subscription waits before reading a partition again after
/// the group refused a commit (a rebalance in progress).
const REWIND_BACKOFF: Duration = Duration::from_millis(50);

/// A Kafka subscription (see [`KafkaBroker`]).
pub struct KafkaSubscription {
    ahead: Option<KafkaDelivery>,
    shared: Arc<Shared>,
    /// Deliveries to hand out again: a fan-out `nack`, or a copy that
    /// could not be sent (bounded by the deliveries handed out).
    again: mpsc::UnboundedReceiver<KafkaDelivery>,
    /// Retry copies not due yet, each holding its (paused) partition.
    held: Vec<(Instant, KafkaDelivery)>,
    /// A record read and not yet handed out: its partition's commits must
    /// allow it first (see `commits.rs`). Kept here so a `next` dropped
    /// while it waits loses nothing.
    pending: Option<Pending>,
    flow: Option<Arc<KafkaFlow>>,
}

/// A record read from librdkafka, not yet handed out.
struct Pending {
    received: record::Received,
    topic: Arc<str>,
    partition: i32,
    offset: i64,
    /// Its partition's window; `None` for fan-out.
    window: Option<Arc<PartitionAcks>>,
}

/// What became of the pending record.
enum Admit {
    Ready(KafkaDelivery),
    /// Dropped, or held until it is due.
    Gone,
    /// Its commit was refused: read the partition again from this offset.
    Rewind(Arc<str>, i32, i64),
    /// Waits for a commit's answer or a settlement.
    Wait,
}

/// What a subscription's deliveries share.
pub(crate) struct Shared {
    pub(crate) broker: KafkaBroker,
    pub(crate) consumer: Arc<Consumer_>,
    pub(crate) subject: Text,
    /// The group's retry topic; `None` for fan-out.
    pub(crate) retry_topic: Option<String>,
    pub(crate) dead_letter: Option<Text>,
    pub(crate) again: mpsc::UnboundedSender<KafkaDelivery>,
    /// Settlements since the last commit.
    settled: AtomicUsize,
    commit_due: Arc<Notify>,
    /// Wakes a subscription whose pending record waits on its window.
    pub(crate) handout: Arc<Notify>,
}

impl Shared {
    fn context(&self) -> &GroupContext {
        self.consumer.context()
    }

    /// Counts a settlement that moved a partition's settled prefix; asks
    /// for a commit when `commit_every` have.
    pub(crate) fn settled(&self) {
        let every = self.broker.settings().commit_every;
        if self.settled.fetch_add(1, Ordering::AcqRel) + 1 >= every {
            self.settled.store(0, Ordering::Release);
            self.commit_due.notify_one();
        }
    }

    /// Commits every settled prefix that moved, without waiting.
    fn commit(&self, mode: CommitMode) {
        let (due, windows) = self.context().commits_due();
        if due.count() == 0 {
            return;
        }
        let result = self.consumer.commit(&due, mode);
        if let Err(err) = &result {
            tracing::warn!(error = %err, "Kafka offset commit failed; it is retried with the next");
            crate::metrics::connection_event("kafka", "commit_failed");
        }
        let mut wake = false;
        for (window, elem) in windows.iter().zip(due.elements()) {
            if result.is_err()
                && let Offset::Offset(at) = elem.offset()
            {
                window.commit_failed(at);
            }
            wake |= window.enqueued();
        }
        if wake {
            self.handout.notify_one();
        }
    }

    /// Commits every settled prefix that moved, waiting for the broker
    /// (blocking: for close).
    pub(crate) fn commit_now(&self) {
        self.commit(CommitMode::Sync);
    }
}

/// Commits settled prefixes every `interval`, or sooner when enough
/// settled; ends with the subscription's last delivery.
async fn commit_coalesced(shared: Weak<Shared>, due: Arc<Notify>, interval: Duration) {
    loop {
        let _ = tokio::time::timeout(interval, due.notified()).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.commit(CommitMode::Async);
    }
}

impl KafkaSubscription {
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Opens the subscription: makes sure its topics exist, then joins the
    /// queue group (starting where the topic ends now wherever the group
    /// has not committed yet) or, for fan-out, assigns every partition
    /// from its end.
    pub(crate) async fn open(broker: KafkaBroker, options: SubscribeOptions) -> Result<Self> {
        let topic = options.subject.as_str().to_owned();
        let partitions = broker.ensure_topic(&topic).await?;
        let settings = broker.settings();
        let (group, retry_topic) = match &options.queue_group {
            Some(group) => (
                format!("{group}@{topic}"),
                Some(format!("{topic}.{}.retry", topic_safe(group))),
            ),
            None => {
                let n = NEXT_FAN_OUT.fetch_add(1, Ordering::Relaxed);
                (
                    format!("rs-fanout-{}-{n}@{topic}", std::process::id()),
                    None,
                )
            }
        };
        if let Some(retry) = &retry_topic {
            broker.ensure_topic(retry).await?;
        }
        let config = settings.consumer_config(broker.bootstrap(), &group);
        let context = GroupContext::new(retry_topic.is_some());
        // New groups start where the topic ends now, unless the app asks
        // for the beginning (`auto.offset.reset=earliest`).
        let from_beginning = settings.properties.iter().any(|(k, v)| {
            k == "auto.offset.reset" && matches!(v.as_str(), "earliest" | "smallest" | "beginning")
        });
        let consumer =
            Arc::new(Consumer_::from_config_and_context(&config, context).map_err(config_error)?);
        let ends = broker
            .ends(Arc::clone(&consumer), &topic, &partitions)
            .await?;
        match &retry_topic {
            Some(retry) => {
                if !from_beginning {
                    let mut starts = consumer
                        .context()
                        .ends
                        .lock()
                        .unwrap_or_else(|e| e.into_inner());
                    for &(p, end) in &ends {
                        starts.insert((topic.clone(), p), end);
                    }
                }
                consumer.subscribe(&[&topic, retry]).map_err(|err| {
                    Error::Transport(format!("Kafka subscribe to `{topic}`: {err}").into())
                })?;
            }
            None => {
                let mut tpl = TopicPartitionList::new();
                for &(p, end) in &ends {
                    let _ = tpl.add_partition_offset(&topic, p, Offset::Offset(end));
                }
                consumer.assign(&tpl).map_err(|err| {
                    Error::Transport(format!("Kafka assign `{topic}`: {err}").into())
                })?;
            }
        }
        let (again_tx, again) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            broker: broker.clone(),
            consumer: Arc::clone(&consumer),
            subject: options.subject.clone(),
            retry_topic,
            dead_letter: options.dead_letter.clone(),
            again: again_tx,
            settled: AtomicUsize::new(0),
            commit_due: Arc::new(Notify::new()),
            handout: Arc::new(Notify::new()),
        });
        if shared.retry_topic.is_some() {
            tokio::spawn(commit_coalesced(
                Arc::downgrade(&shared),
                Arc::clone(&shared.commit_due),
                settings.commit_interval,
            ));
        }
        let flow = options
            .receive_flow
            .then(|| Arc::new(KafkaFlow::new(Arc::downgrade(&consumer))));
        Ok(KafkaSubscription {
            ahead: None,
            shared,
            again,
            held: Vec::new(),
            pending: None,
            flow,
        })
    }

    /// The record, pending; `None` when it must not be handed out (a group
    /// member's partition that is no longer assigned).
    fn prepare(&self, record: &BorrowedMessage<'_>) -> Option<Pending> {
        let (topic, partition, offset) = (record.topic(), record.partition(), record.offset());
        let (topic, window) = match self.shared.context().window(topic, partition) {
            Some((topic, window)) if self.shared.retry_topic.is_some() => (topic, Some(window)),
            None if self.shared.retry_topic.is_some() => return None,
            _ => (Arc::from(topic), None),
        };
        Some(Pending {
            received: record::read(record),
            topic,
            partition,
            offset,
            window,
        })
    }

    /// Asks the pending record's window whether it may go out (sending
    /// the commit it asks for).
    fn admit(&mut self) -> Admit {
        let Some(pending) = &self.pending else {
            return Admit::Gone;
        };
        let attempt = pending.received.attempt;
        let gate = match &pending.window {
            None => Gate::Open(attempt),
            Some(window) => {
                let (gate, commit) = window.hand_out(pending.offset, attempt);
                if let Some(commit) = commit {
                    let (topic, window) = (Arc::clone(&pending.topic), Arc::clone(window));
                    commits::send(&self.shared, topic, pending.partition, window, commit);
                }
                gate
            }
        };
        match gate {
            Gate::Wait => Admit::Wait,
            Gate::Open(attempt) => match self.pending.take() {
                Some(pending) => self
                    .deliver(pending, attempt)
                    .map_or(Admit::Gone, Admit::Ready),
                None => Admit::Gone,
            },
            Gate::Sealed => {
                self.pending = None;
                Admit::Gone
            }
            Gate::Rewind(at) => match self.pending.take() {
                Some(pending) => Admit::Rewind(pending.topic, pending.partition, at),
                None => Admit::Gone,
            },
        }
    }

    /// Reads a partition again from `offset` (a commit the record at hand
    /// waited on was refused, typically by a rebalance in progress; a
    /// moment later, so a refusing group is not asked in a tight loop).
    async fn rewind(&self, topic: Arc<str>, partition: i32, offset: i64) {
        let closing = self.shared.broker.closing().clone();
        tokio::select! {
            () = closing.cancelled() => return,
            () = tokio::time::sleep(REWIND_BACKOFF) => {}
        }
        let consumer = Arc::clone(&self.shared.consumer);
        let timeout = self.shared.broker.settings().metadata_timeout;
        let sought = super::blocking(move || {
            consumer.seek(&topic, partition, Offset::Offset(offset), timeout)
        })
        .await;
        if let Err(err) = sought {
            // A revoked partition: its next owner reads from the commit.
            tracing::debug!(partition, offset, error = %err, "Kafka: rewinding a partition failed");
        }
    }

    /// The delivery of a record its window let out as `attempt`; `None`
    /// when it is a retry copy not due yet, now held.
    fn deliver(&mut self, pending: Pending, attempt: u32) -> Option<KafkaDelivery> {
        let Pending {
            received,
            topic,
            partition,
            offset,
            window,
        } = pending;
        let shared = &self.shared;
        let at = window.map(|window| At { window, offset });
        let subject = received.subject.unwrap_or_else(|| shared.subject.clone());
        let env = Envelope::new(subject, received.message).with_attempt(attempt);
        let delivery = KafkaDelivery::new(env, at, (Arc::clone(&topic), partition, offset), shared);
        match received
            .not_before
            .and_then(|t| t.duration_since(SystemTime::now()).ok())
        {
            Some(wait) if !wait.is_zero() => {
                self.hold(Instant::now() + wait, delivery, &topic, partition);
                None
            }
            _ => Some(delivery),
        }
    }

    /// Holds a retry copy until `due`, pausing its partition meanwhile.
    fn hold(&mut self, due: Instant, delivery: KafkaDelivery, topic: &str, partition: i32) {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, partition);
        let _ = self.shared.consumer.pause(&tpl);
        if let Some(flow) = &self.flow {
            flow.hold(topic, partition);
        }
        self.held.push((due, delivery));
    }

    /// A held retry copy whose time came, its partition resumed.
    fn release_due(&mut self) -> Option<KafkaDelivery> {
        let now = Instant::now();
        let at = self.held.iter().position(|(due, _)| *due <= now)?;
        let (_, delivery) = self.held.swap_remove(at);
        let (topic, partition, _) = delivery.origin();
        let paused = self
            .flow
            .as_ref()
            .is_some_and(|flow| flow.release(topic, partition));
        if !paused {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(topic, partition);
            let _ = self.shared.consumer.resume(&tpl);
        }
        Some(delivery)
    }
}

impl Subscription for KafkaSubscription {
    type Delivery = KafkaDelivery;

    fn receive_flow(&self) -> Option<Arc<dyn ReceiveFlow>> {
        self.flow
            .as_ref()
            .map(|flow| Arc::clone(flow) as Arc<dyn ReceiveFlow>)
    }

    crate::binding::read_ahead_of_one!(KafkaDelivery);

    async fn next(&mut self) -> Option<KafkaDelivery> {
        if let Some(delivery) = self.ahead.take() {
            return Some(delivery);
        }
        let consumer = Arc::clone(&self.shared.consumer);
        let closing = self.shared.broker.closing().clone();
        let shared = Arc::clone(&self.shared);
        loop {
            if closing.is_cancelled() {
                return None;
            }
            while let Some(delivery) = self.release_due() {
                if !delivery.revoked() {
                    return Some(delivery);
                }
            }
            // While the record at hand waits, nothing more is read.
            let waiting = match self.admit() {
                Admit::Ready(delivery) => return Some(delivery),
                Admit::Gone => false,
                Admit::Rewind(topic, partition, at) => {
                    self.rewind(topic, partition, at).await;
                    continue;
                }
                Admit::Wait => true,
            };
            let due = self.held.iter().map(|(due, _)| *due).min();
            let wake = due.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                biased;
                () = closing.cancelled() => return None,
                () = shared.handout.notified(), if waiting => {}
                Some(delivery) = self.again.recv() => {
                    if !delivery.revoked() {
                        return Some(delivery);
                    }
                }
                () = tokio::time::sleep_until(wake), if due.is_some() => {}
                received = consumer.recv(), if !waiting => match received {
                    Ok(record) => self.pending = self.prepare(&record),
                    Err(err) => {
                        tracing::debug!(subject = %self.shared.subject, error = %err, "Kafka consumer error");
                        crate::metrics::connection_event("kafka", "consume_error");
                    }
                },
            }
        }
    }
}

impl Drop for KafkaSubscription {
    fn drop(&mut self) {
        // Whatever settled goes out now; the consumer commits the rest as
        // its partitions are revoked when it closes.
        self.shared.commit(CommitMode::Async);
    }
}
