//! One RabbitMQ subscription: a queue bound to the exchange, consumed on a
//! channel of its own with a prefetch the app's job queue can take.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicNackOptions, BasicQosOptions, BasicRejectOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};

use super::acks::Acks;
use super::{KEY, REDELIVERY, RabbitBroker, SUBJECT, binding_key, transport};
use crate::binding::pull_flow::PullFlow;
use crate::binding::{Delivery, RetryAfter, SubscribeOptions, Subscription};
use crate::ingress::{JobQueue, ReceiveFlow};
use crate::message::header;
use crate::{Envelope, Message, Result, Text};

/// Where a subscription's consumer is.
enum Consumer {
    NotStarted,
    Starting(tokio::task::JoinHandle<lapin::Result<lapin::Consumer>>),
    Ready(lapin::Consumer),
}

/// A RabbitMQ subscription (see [`RabbitBroker`]).
pub struct RabbitSubscription {
    channel: lapin::Channel,
    queue: String,
    prefetch: u16,
    consumer: Consumer,
    /// A redelivery received, waiting for the acks before it to go out.
    held: Option<lapin::message::Delivery>,
    flow: Option<Arc<Flow>>,
    shared: Arc<Shared>,
    /// The read-ahead of one that [`ready`](Subscription::ready) waits
    /// for: received, not yet handed to the runtime.
    ahead: Option<RabbitDelivery>,
}

struct Shared {
    broker: RabbitBroker,
    /// A quorum queue: the broker counts deliveries.
    quorum: bool,
    queue: String,
    dead_letter: Option<Text>,
    acks: Arc<Acks>,
}

impl RabbitSubscription {
    pub(super) async fn open(broker: RabbitBroker, options: SubscribeOptions) -> Result<Self> {
        let channel = broker
            .inner
            .conn
            .create_channel()
            .await
            .map_err(transport)?;
        let (name, declare) = match &options.queue_group {
            Some(group) => (
                format!("{group}@{}", options.subject),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
            ),
            // Named here, not by the server: a recovered connection
            // declares the same name again, and its consumer finds it.
            None => (
                fanout_queue_name(&options.subject),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
            ),
        };
        let mut arguments = FieldTable::default();
        if let (Some(_), Some(idle)) = (&options.queue_group, broker.inner.settings.queue_expires) {
            let ms = u32::try_from(idle.as_millis()).unwrap_or(u32::MAX);
            arguments.insert("x-expires".into(), AMQPValue::LongUInt(ms));
        }
        let quorum = options.queue_group.is_some() && broker.inner.settings.quorum;
        if quorum {
            arguments.insert("x-queue-type".into(), super::long("quorum"));
            if let Some(deliveries) = options.max_deliveries {
                // Returned this many times more than the first delivery.
                let returns = deliveries.saturating_sub(1);
                arguments.insert("x-delivery-limit".into(), AMQPValue::LongUInt(returns));
            }
        }
        if let Some(dead_letter) = &options.dead_letter {
            // What the broker itself dead-letters (a reject without requeue,
            // when the enriched dead-letter publish is not possible) goes to
            // the dead-letter subject too.
            let exchange = broker.inner.settings.exchange.as_str();
            arguments.insert("x-dead-letter-exchange".into(), super::long(exchange));
            arguments.insert(
                "x-dead-letter-routing-key".into(),
                super::long(dead_letter.as_str()),
            );
        }
        let queue = channel
            .queue_declare(name.as_str().into(), declare, arguments)
            .await
            .map_err(|err| declare_failed(&name, err))?;
        let queue = queue.name().as_str().to_owned();
        channel
            .queue_bind(
                queue.as_str().into(),
                broker.inner.settings.exchange.as_str().into(),
                binding_key(&options.subject).as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(transport)?;
        let acks = Acks::new(broker.inner.settings.ack_window);
        {
            let mut windows = broker
                .inner
                .ack_windows
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            windows.retain(|window| window.strong_count() > 0);
            windows.push(Arc::downgrade(&acks));
        }
        Ok(RabbitSubscription {
            ahead: None,
            channel,
            prefetch: broker.inner.settings.prefetch,
            consumer: Consumer::NotStarted,
            held: None,
            flow: options.receive_flow.then(|| {
                Arc::new(Flow {
                    gate: PullFlow::default(),
                    acks: Arc::clone(&acks),
                })
            }),
            shared: Arc::new(Shared {
                broker,
                quorum,
                queue: queue.clone(),
                dead_letter: options.dead_letter,
                acks,
            }),
            queue,
        })
    }

    /// Starts consuming on the first call, with the prefetch settled by
    /// then. The setup runs as a task of its own: a `next` cancelled halfway
    /// (JQ-11: `next` is cancel-safe) never leaves a consumer registered on
    /// the broker with nobody reading it.
    async fn consumer(&mut self) -> lapin::Result<&mut lapin::Consumer> {
        if let Consumer::NotStarted = self.consumer {
            let channel = self.channel.clone();
            let queue = self.queue.clone();
            let prefetch = self.prefetch;
            self.consumer = Consumer::Starting(tokio::spawn(async move {
                channel
                    .basic_qos(prefetch, BasicQosOptions::default())
                    .await?;
                channel
                    .basic_consume(
                        queue.as_str().into(),
                        "".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
            }));
        }
        if let Consumer::Starting(setup) = &mut self.consumer {
            let started = setup.await.unwrap_or_else(|err| {
                Err(
                    lapin::ErrorKind::IOError(std::sync::Arc::new(std::io::Error::other(err)))
                        .into(),
                )
            });
            match started {
                Ok(consumer) => self.consumer = Consumer::Ready(consumer),
                Err(err) => {
                    self.consumer = Consumer::NotStarted;
                    return Err(err);
                }
            }
        }
        match &mut self.consumer {
            Consumer::Ready(consumer) => Ok(consumer),
            _ => unreachable!("started above"),
        }
    }

    /// A received delivery, handed out; a redelivery only once the acks of
    /// the deliveries before it are out: should it take the process down
    /// again, they stay acked. It waits in `held` meanwhile, so a `next`
    /// cancelled then loses nothing.
    async fn hand_out(&mut self, delivery: lapin::message::Delivery) -> RabbitDelivery {
        let delivery = if delivery.redelivered {
            self.held = Some(delivery);
            if let Err(err) = self.shared.acks.flush().await {
                tracing::debug!(queue = %self.queue, error = %err, "RabbitMQ ack flush before a redelivery failed");
            }
            self.held.take().expect("held above")
        } else {
            delivery
        };
        let epoch = self.shared.acks.delivered(delivery.delivery_tag);
        RabbitDelivery::new(delivery, epoch, &self.shared)
    }

    /// The channel broke under the consumer: the deliveries it held go back
    /// to the queue on the broker, so their settlements are refused from now
    /// on; then wait until the client has reconnected and re-created the
    /// channel and its consumer. `false` if it cannot recover.
    async fn recover(&self, err: lapin::Error) -> bool {
        self.shared.acks.reset();
        crate::metrics::connection_event("rabbitmq", "consumer_interrupted");
        tracing::warn!(queue = %self.queue, error = %err, "RabbitMQ consumer interrupted; waiting for recovery");
        match self.channel.wait_for_recovery(err).await {
            Ok(()) => {
                crate::metrics::connection_event("rabbitmq", "consumer_recovered");
                tracing::info!(queue = %self.queue, "RabbitMQ consumer recovered");
                true
            }
            Err(err) => {
                crate::metrics::connection_event("rabbitmq", "consume_failed");
                tracing::warn!(queue = %self.queue, error = %err, "RabbitMQ consumer cannot recover; subscription ends");
                false
            }
        }
    }
}

/// A queue that exists with other arguments (dead-letter target, expiry)
/// cannot be declared again: say so, and how to fix it.
fn declare_failed(queue: &str, err: lapin::Error) -> crate::Error {
    let text = err.to_string();
    if text.contains("PRECONDITION_FAILED") {
        return crate::Error::Config(format!(
            "RabbitMQ queue `{queue}` already exists with other settings (a changed \
             dead-letter subject, queue_expires, quorum_queues, or max_attempts on a \
             quorum queue?): {text}; delete the queue (`rabbitmqctl delete_queue {queue}`) \
             or keep its old settings"
        ));
    }
    transport(err)
}

/// A fan-out subscription's own queue name (not `amq.`: that prefix is the
/// server's).
fn fanout_queue_name(subject: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "ruststream.fanout.{subject}.{}-{nanos:x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Header a quorum queue sets on a redelivery: how often it was returned.
const DELIVERY_COUNT: &str = "x-delivery-count";

fn count(value: &AMQPValue) -> u32 {
    let n = match value {
        AMQPValue::LongLongInt(n) => *n,
        AMQPValue::LongInt(n) => i64::from(*n),
        AMQPValue::LongUInt(n) => i64::from(*n),
        AMQPValue::ShortInt(n) => i64::from(*n),
        AMQPValue::ShortUInt(n) => i64::from(*n),
        _ => 0,
    };
    u32::try_from(n).unwrap_or(0)
}

fn text(value: &AMQPValue) -> Option<String> {
    match value {
        AMQPValue::LongString(s) => String::from_utf8(s.as_bytes().to_vec()).ok(),
        AMQPValue::ShortString(s) => Some(s.as_str().to_owned()),
        _ => None,
    }
}

impl Subscription for RabbitSubscription {
    type Delivery = RabbitDelivery;

    crate::binding::read_ahead_of_one!(RabbitDelivery);

    async fn next(&mut self) -> Option<RabbitDelivery> {
        if let Some(delivery) = self.ahead.take() {
            return Some(delivery);
        }
        if self.shared.broker.ensure_open().is_err() {
            return None;
        }
        if let Some(flow) = &self.flow {
            flow.gate.running().await;
        }
        if let Some(held) = self.held.take()
            && held.acker.usable()
        {
            return Some(self.hand_out(held).await);
        }
        loop {
            let next = match self.consumer().await {
                Ok(consumer) => consumer.next().await?,
                Err(err) => Err(err),
            };
            match next {
                // Read from the buffer of a channel that has since broken:
                // the broker requeued it already, so it comes back.
                Ok(delivery) if !delivery.acker.usable() => continue,
                Ok(delivery) => return Some(self.hand_out(delivery).await),
                Err(err) => {
                    if !self.recover(err).await {
                        return None;
                    }
                }
            }
        }
    }

    fn receive_flow(&self) -> Option<Arc<dyn ReceiveFlow>> {
        self.flow
            .as_ref()
            .map(|flow| Arc::clone(flow) as Arc<dyn ReceiveFlow>)
    }

    /// Prefetch never exceeds what the job queue can hold (JQ-4).
    fn use_job_queue(&mut self, jobs: &Arc<JobQueue>) {
        let max = u16::try_from(jobs.pressure().max).unwrap_or(u16::MAX);
        self.prefetch = self.prefetch.min(max).max(1);
    }
}

/// The receive-flow switch (JQ-15): while PAUSED, `next` takes nothing
/// and the broker's credit stays held; pausing also sends the acks that
/// wait in the window at once.
struct Flow {
    gate: PullFlow,
    acks: Arc<Acks>,
}

impl ReceiveFlow for Flow {
    fn set_paused(&self, paused: bool) {
        self.gate.set_paused(paused);
        if paused && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let acks = Arc::clone(&self.acks);
            runtime.spawn(async move { acks.flush().await });
        }
    }
}

/// A RabbitMQ delivery, unacked until settled; requeued if dropped.
pub struct RabbitDelivery {
    env: Envelope,
    tag: u64,
    /// The ack window's epoch when it was delivered.
    epoch: u64,
    acker: Option<lapin::Acker>,
    shared: Arc<Shared>,
}

/// The envelope of a received delivery (also a direct reply-to reply, with
/// no `own_queue`). The subject and attempt headers of a nack or retry copy
/// count only where the copy was routed back into the consuming queue
/// itself (`own_queue`): a copy the broker dead-lettered elsewhere arrives
/// under the dead-letter subject, with where it came from as
/// `ruststream-original-subject`.
pub(super) fn envelope(delivery: lapin::message::Delivery, own_queue: Option<&str>) -> Envelope {
    let lapin::message::Delivery {
        routing_key,
        redelivered,
        properties,
        data,
        ..
    } = delivery;
    let mut message = Message::new(bytes::Bytes::from(data));
    let own_copy = own_queue == Some(routing_key.as_str());
    let mut subject = routing_key.as_str().to_owned();
    let mut attempt = 1 + u32::from(redelivered);
    if let Some(headers) = properties.headers() {
        for (name, value) in headers {
            if name.as_str() == DELIVERY_COUNT {
                // A quorum queue's count of earlier deliveries.
                attempt = attempt.max(count(value).saturating_add(1));
                continue;
            }
            let Some(value) = text(value) else {
                if matches!(value, AMQPValue::LongString(_)) {
                    crate::metrics::unreadable_header("rabbitmq", &subject, name.as_str());
                }
                continue;
            };
            match name.as_str() {
                // Why the broker itself dead-lettered it (a quorum queue's
                // delivery limit, say): the reason, unless the runtime gave
                // one.
                "x-first-death-reason" if message.headers().get(header::ERROR).is_none() => {
                    let reason = format!("dead-lettered by the broker: {value}");
                    message = message.with_header(header::ERROR, reason);
                }
                // The rest of the broker's bookkeeping, not the sender's.
                name if name.starts_with("x-first-death-") || name.starts_with("x-last-death-") => {
                }
                KEY => message = message.with_key(value),
                SUBJECT if own_copy => subject = value,
                SUBJECT => message = message.with_header(header::ORIGINAL_SUBJECT, value),
                // The copy's attempt, plus one if the copy itself came back.
                REDELIVERY if own_copy => {
                    attempt = value
                        .parse::<u32>()
                        .map_or(attempt, |a| a + u32::from(redelivered));
                }
                REDELIVERY => {}
                other => message = message.with_header(other, value),
            }
        }
    }
    if let Some(id) = properties.correlation_id() {
        message = message.with_correlation_id(id.as_str());
    }
    if let Some(reply) = properties.reply_to() {
        message = message.with_reply_to(reply.as_str());
    }
    Envelope::new(Text::from(subject), message).with_attempt(attempt)
}

impl RabbitDelivery {
    fn new(delivery: lapin::message::Delivery, epoch: u64, shared: &Arc<Shared>) -> Self {
        let tag = delivery.delivery_tag;
        let acker = delivery.acker.clone();
        RabbitDelivery {
            env: envelope(delivery, Some(&shared.queue)),
            tag,
            epoch,
            acker: Some(acker),
            shared: Arc::clone(shared),
        }
    }

    /// Acked through the channel's coalescing window.
    async fn ack_now(mut self) -> Result<()> {
        let Some(acker) = self.acker.take() else {
            return Ok(());
        };
        self.shared.acks.ack(self.epoch, self.tag, acker).await
    }

    /// Acked, with the window sent at once: the end of a nack, reject or
    /// retry does not wait for company.
    async fn ack_flushed(self) -> Result<()> {
        let acks = Arc::clone(&self.shared.acks);
        self.ack_now().await?;
        acks.flush().await
    }

    /// `basic.reject` with requeue, which a quorum queue counts as a
    /// delivery attempt.
    async fn return_to_queue(mut self) -> Result<()> {
        let Some(acker) = self.acker.take() else {
            return Ok(());
        };
        let returned = acker
            .reject(BasicRejectOptions { requeue: true })
            .await
            .map_err(transport);
        self.shared.acks.gone(self.epoch, self.tag);
        returned.map(|_| ())
    }

    /// `basic.reject` without requeue: the broker routes it to the queue's
    /// dead-letter exchange.
    async fn reject_to_dead_letter_exchange(mut self) -> Result<()> {
        let Some(acker) = self.acker.take() else {
            return Ok(());
        };
        let rejected = acker
            .reject(BasicRejectOptions { requeue: false })
            .await
            .map_err(transport);
        self.shared.acks.gone(self.epoch, self.tag);
        rejected.map(|_| ())
    }

    async fn requeue(mut self) -> Result<()> {
        let Some(acker) = self.acker.take() else {
            return Ok(());
        };
        let nacked = acker
            .nack(BasicNackOptions {
                requeue: true,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(transport);
        // Only once the nack is out may a multiple ack pass this tag.
        self.shared.acks.gone(self.epoch, self.tag);
        nacked
    }
}

impl Delivery for RabbitDelivery {
    fn envelope(&self) -> &Envelope {
        &self.env
    }

    async fn ack(self) -> Result<()> {
        self.ack_now().await
    }

    /// A copy goes back to the same queue with attempt + 1, then the
    /// original is acked; if the copy cannot be published the original is
    /// requeued instead, so nothing is lost. On a quorum queue, which counts
    /// deliveries itself, a plain requeue.
    async fn nack(self) -> Result<()> {
        if self.shared.quorum {
            // The broker counts it: back to the queue, attempt + 1. A
            // reject, not a nack: RabbitMQ 4.3 counts only rejects.
            return self.return_to_queue().await;
        }
        let shared = Arc::clone(&self.shared);
        let attempt = (self.env.attempt() + 1).to_string();
        let subject = self.env.subject().as_str().to_owned();
        let properties = super::properties(
            self.env.message(),
            &[(REDELIVERY, attempt), (SUBJECT, subject)],
        );
        let copy = shared
            .broker
            .publish_to("", &shared.queue, self.env.payload(), properties, None)
            .await;
        match copy {
            Ok(()) => self.ack_flushed().await,
            Err(err) => {
                self.requeue().await?;
                Err(err)
            }
        }
    }

    /// The broker holds the delay: the copy waits in a delay queue of this
    /// queue (per-message TTL) and is dead-lettered back into it when due,
    /// so the retry survives a crash of this process.
    async fn retry_after(self, delay: Duration) -> RetryAfter<Self> {
        self.retry_held(delay).await
    }

    /// Publishes to the dead-letter subject with the reason (when one is
    /// set), then acks.
    async fn reject(self, reason: &str) -> Result<()> {
        let shared = Arc::clone(&self.shared);
        match &shared.dead_letter {
            Some(dead_letter) => {
                let exchange = shared.broker.inner.settings.exchange.clone();
                let extra = [
                    (
                        header::ORIGINAL_SUBJECT,
                        self.env.subject().as_str().to_owned(),
                    ),
                    (header::ERROR, reason.to_owned()),
                    (header::ATTEMPT, self.env.attempt().to_string()),
                ];
                let properties = super::properties(self.env.message(), &extra);
                if let Err(err) = shared
                    .broker
                    .publish_to(&exchange, dead_letter, self.env.payload(), properties, None)
                    .await
                {
                    // The queue's dead-letter exchange takes it instead
                    // (without the reason headers; the broker adds x-death).
                    tracing::warn!(error = %err, "RabbitMQ dead-letter publish failed; the broker dead-letters it");
                    return self.reject_to_dead_letter_exchange().await;
                }
            }
            None => tracing::warn!(
                subject = %self.env.subject(),
                attempt = self.env.attempt(),
                reason,
                "message rejected and dropped (no dead-letter subject configured)"
            ),
        }
        self.ack_flushed().await
    }
}

impl RabbitDelivery {
    /// The delayed copy goes to the broker (see [`Delivery::retry_after`]),
    /// then this delivery is acked. If the broker does not take the copy,
    /// the runtime keeps the timer instead.
    async fn retry_held(self, delay: Duration) -> RetryAfter<Self> {
        let message = self.env.retry_copy(Duration::ZERO);
        let subject = self.env.subject().as_str();
        let shared = &self.shared;
        match shared
            .broker
            .publish_delayed(&shared.queue, subject, &message, delay)
            .await
        {
            Ok(()) => RetryAfter::Held(self.ack_flushed().await),
            Err(err) => {
                tracing::warn!(queue = %shared.queue, error = %err, "RabbitMQ delayed retry refused; retrying from a timer");
                RetryAfter::NotHeld(self)
            }
        }
    }
}

impl Drop for RabbitDelivery {
    fn drop(&mut self) {
        let Some(acker) = self.acker.take() else {
            return;
        };
        // Unsettled: back to the queue now (the broker would requeue it when
        // the channel closes anyway).
        let (acks, epoch, tag) = (Arc::clone(&self.shared.acks), self.epoch, self.tag);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = acker
                    .nack(BasicNackOptions {
                        requeue: true,
                        ..Default::default()
                    })
                    .await;
                acks.gone(epoch, tag);
            });
        }
    }
}

impl Drop for RabbitSubscription {
    fn drop(&mut self) {
        let channel = self.channel.clone();
        let acks = Arc::clone(&self.shared.acks);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                // Settled acks first: closing requeues only what is unsettled.
                let _ = acks.flush().await;
                super::close_channel(channel, "subscription closed").await;
            });
        }
    }
}
