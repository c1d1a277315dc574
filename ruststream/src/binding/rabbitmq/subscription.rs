//! One RabbitMQ subscription: a queue bound to the exchange, consumed on a
//! channel of its own with a prefetch the app's job queue can take.

use std::sync::Arc;

use futures_util::StreamExt;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};

use super::acks::Acks;
use super::delivery::RabbitDelivery;
use super::{RabbitBroker, binding_key, transport};
use crate::binding::pull_flow::PullFlow;
use crate::binding::{SubscribeOptions, Subscription};
use crate::ingress::{JobQueue, ReceiveFlow};
use crate::{Result, Text};

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

pub(super) struct Shared {
    pub(super) broker: RabbitBroker,
    /// A quorum queue: the broker counts deliveries.
    pub(super) quorum: bool,
    pub(super) queue: String,
    pub(super) dead_letter: Option<Text>,
    pub(super) acks: Arc<Acks>,
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
    /// (`next` is cancel-safe) never leaves a consumer registered on
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
pub(super) const DELIVERY_COUNT: &str = "x-delivery-count";

pub(super) fn count(value: &AMQPValue) -> u32 {
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

pub(super) fn text(value: &AMQPValue) -> Option<String> {
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

    /// Prefetch never exceeds what the job queue can hold.
    fn use_job_queue(&mut self, jobs: &Arc<JobQueue>) {
        let max = u16::try_from(jobs.pressure().max).unwrap_or(u16::MAX);
        self.prefetch = self.prefetch.min(max).max(1);
    }
}

/// The receive-flow switch: while PAUSED, `next` takes nothing
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
