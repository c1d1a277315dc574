//! One RabbitMQ delivery: settled through the subscription's ack window,
//! redelivered with its attempt counted, dead-lettered with its reason.

use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;

use super::subscription::{DELIVERY_COUNT, Shared, count, text};
use super::{KEY, REDELIVERY, SUBJECT, transport};
use crate::binding::known_text::{self, owned_text};
use crate::binding::{Delivery, RetryAfter};
use crate::message::header;
use crate::{Envelope, Message, Result, Text};

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
                other => message = message.with_header(known_text::text(other), owned_text(value)),
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
    pub(super) fn new(
        delivery: lapin::message::Delivery,
        epoch: u64,
        shared: &Arc<Shared>,
    ) -> Self {
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
                let extra = crate::binding::dead_letter_headers(&self.env, reason);
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
            // Debug: the runtime already logged the rejection and its reason.
            None => tracing::debug!(
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
