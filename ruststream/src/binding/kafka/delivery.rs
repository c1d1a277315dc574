//! One Kafka record handed out, and how settling it moves its partition's
//! committed offset.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::offsets::PartitionAcks;
use super::record::{self, ORIGINAL_OFFSET, ORIGINAL_PARTITION};
use super::subscription::Shared;
use crate::binding::{Delivery, RetryAfter};
use crate::message::header;
use crate::{Envelope, Error, Result};

/// Where a group member's record sits in its partition's settlement
/// window.
pub(crate) struct At {
    pub(crate) window: Arc<PartitionAcks>,
    pub(crate) offset: i64,
}

/// A Kafka record, uncommitted until settled.
pub struct KafkaDelivery {
    env: Envelope,
    /// `None` for fan-out, which commits nothing.
    at: Option<At>,
    /// Topic, partition and offset the record was read from.
    origin: (Arc<str>, i32, i64),
    shared: Arc<Shared>,
}

impl KafkaDelivery {
    pub(crate) fn new(
        env: Envelope,
        at: Option<At>,
        origin: (Arc<str>, i32, i64),
        shared: &Arc<Shared>,
    ) -> Self {
        KafkaDelivery {
            env,
            at,
            origin,
            shared: Arc::clone(shared),
        }
    }

    /// Topic, partition and offset the record was read from.
    pub(crate) fn origin(&self) -> (&str, i32, i64) {
        (&self.origin.0, self.origin.1, self.origin.2)
    }

    /// Whether its partition was revoked since it was read: it must not be
    /// handed out (the partition's next owner reads it again).
    pub(crate) fn revoked(&self) -> bool {
        self.at.as_ref().is_some_and(|at| at.window.sealed())
    }

    /// Marks the record settled in its window.
    fn settle(&self) {
        let Some(at) = &self.at else { return };
        let settled = at.window.settle(at.offset);
        if settled.wake {
            self.shared.handout.notify_one();
        }
        if settled.grew {
            self.shared.settled();
        }
    }

    /// Hands the delivery back to its subscription, with `attempt`.
    fn again(self, attempt: u32) {
        let mut delivery = self;
        delivery.env = delivery.env.clone().with_attempt(attempt);
        let shared = Arc::clone(&delivery.shared);
        let _ = shared.again.send(delivery);
    }

    /// Sends a copy of the record to the group's retry topic with `extra`
    /// bookkeeping, then settles this one; when the copy cannot be sent,
    /// the delivery comes back to the subscription with `attempt` and the
    /// error is returned.
    async fn copy_to_retry(self, headers: &[(&str, &str)], attempt: u32) -> Result<()> {
        let Some(retry) = self.shared.retry_topic.clone() else {
            self.again(attempt);
            return Ok(());
        };
        let subject = self.env.subject().clone();
        let mut extra = vec![(record::SUBJECT, subject.as_str())];
        extra.extend_from_slice(headers);
        let deadline = Instant::now() + self.shared.broker.settings().publish_timeout;
        let sent = self
            .shared
            .broker
            .produce(&retry, self.env.message(), &extra, deadline)
            .await;
        match sent {
            Ok(()) => {
                self.settle();
                Ok(())
            }
            Err(err) => {
                tracing::warn!(subject = %subject, error = %err, "Kafka: the retry copy could not be sent; the record is handed out again");
                self.again(attempt);
                Err(err)
            }
        }
    }
}

impl Delivery for KafkaDelivery {
    fn envelope(&self) -> &Envelope {
        &self.env
    }

    /// Settles the record: its partition's offset is committed once every
    /// record before it is settled too (coalesced; see
    /// [`commit_every`](super::KafkaBrokerBuilder::commit_every)).
    async fn ack(self) -> Result<()> {
        self.settle();
        Ok(())
    }

    fn try_ack(&mut self) -> Option<Result<()>> {
        self.settle();
        Some(Ok(()))
    }

    /// A copy with attempt + 1 goes to the group's retry topic, and this
    /// record is settled: the partition goes on. A fan-out subscription
    /// hands the record out again itself.
    async fn nack(self) -> Result<()> {
        let attempt = self.env.attempt().saturating_add(1);
        let redelivery = attempt.to_string();
        self.copy_to_retry(&[(record::REDELIVERY, &redelivery)], attempt)
            .await
    }

    /// Copies the record to the dead-letter topic with the reason, the
    /// original topic, partition and offset and the attempt, then settles
    /// it. Without a dead-letter topic it is dropped with a warning. If
    /// the copy cannot be sent, the record is handed out again.
    async fn reject(self, reason: &str) -> Result<()> {
        let Some(dead_letter) = self.shared.dead_letter.clone() else {
            // Debug: the runtime already logged the rejection and its reason.
            tracing::debug!(
                subject = %self.env.subject(),
                attempt = self.env.attempt(),
                reason,
                "message rejected and dropped (no dead-letter subject configured)"
            );
            self.settle();
            return Ok(());
        };
        let (topic, partition, offset) = self.origin();
        let message =
            crate::binding::with_dead_letter_headers(self.env.message().clone(), &self.env, reason)
                .with_header(ORIGINAL_PARTITION, partition.to_string())
                .with_header(ORIGINAL_OFFSET, offset.to_string())
                .with_header(header::ORIGINAL_ID, format!("{topic}/{partition}/{offset}"));
        let deadline = Instant::now() + self.shared.broker.settings().publish_timeout;
        match self
            .shared
            .broker
            .produce(&dead_letter, &message, &[], deadline)
            .await
        {
            Ok(()) => {
                self.settle();
                Ok(())
            }
            Err(err) => {
                let attempt = self.env.attempt().saturating_add(1);
                self.again(attempt);
                Err(Error::Transport(
                    format!("Kafka dead letter to `{dead_letter}`: {err}").into(),
                ))
            }
        }
    }

    /// A group member sends the copy to its retry topic with the time it
    /// is due and settles this record; the member that reads the copy
    /// holds it until then, so the retry survives a crash of this process.
    /// A fan-out subscription hands the delivery back to the runtime's
    /// timer.
    async fn retry_after(self, delay: Duration) -> RetryAfter<Self> {
        if self.shared.retry_topic.is_none() {
            return RetryAfter::NotHeld(self);
        }
        let retries = self.env.total_attempt().to_string();
        let due = record::epoch_ms_after(delay).to_string();
        let mut copy_of = self;
        let mut headers = copy_of.env.headers().clone();
        headers.remove(header::RETRIES);
        headers.remove(header::RETRY_DELAY_MS);
        headers.insert(header::RETRIES, retries);
        let message = copy_of.env.message().clone().with_headers(headers);
        let attempt = copy_of.env.attempt();
        copy_of.env = Envelope::new(copy_of.env.subject().clone(), message).with_attempt(1);
        let result = copy_of
            .copy_to_retry(&[(record::NOT_BEFORE, &due)], attempt.saturating_add(1))
            .await;
        RetryAfter::Held(result)
    }
}
