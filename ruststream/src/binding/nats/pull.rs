//! How a JetStream subscription pulls: only when the runtime asks for the
//! next message, at most a window at a time, one at a time where a message
//! may take the connection or the process down, and again at once where
//! the connection came back under an open pull.

use std::time::Duration;

use async_nats::jetstream::{self, consumer};
use futures_util::{FutureExt, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;

use super::{ack_subject, durable};

/// How a subscription pulls: at most `window` messages per pull, each pull
/// open for `expires`, and a new pull at once where the connection came
/// back under an open one.
pub(super) struct Puller {
    consumer: consumer::PullConsumer,
    client: async_nats::Client,
    window: usize,
    expires: Duration,
    reconnects: watch::Receiver<u64>,
    /// Until then, pulls ask for one message. Set when the connection was
    /// lost under an open pull — which is what a message the client cannot
    /// read does: async-nats drops the connection on it, and with it every
    /// message after it in the same pull. One at a time, such a message
    /// takes down only its own pull while the messages after it flow, until
    /// the server gives up on it (see `given_up`).
    careful_until: Option<Instant>,
    /// `ack_wait` + `expires`: a poison message comes back every `ack_wait`.
    careful_for: Duration,
    /// The last message pulled was a redelivery (or none was pulled yet):
    /// the next pull asks for one message. A message that took a process
    /// down comes back as a redelivery; alone in its pull, it takes no
    /// other message down with it if it does so again — nor counts a
    /// delivery against one.
    redelivering: bool,
    /// A redelivery pulled, waiting for the acks before it to go out.
    held: Option<(jetstream::Message, u32)>,
    checkpoints: Option<durable::Checkpoints>,
}

impl Puller {
    /// Pulls through `consumer` on `client`'s connection.
    pub(super) fn new(
        consumer: consumer::PullConsumer,
        client: async_nats::Client,
        reconnects: watch::Receiver<u64>,
        (window, expires, ack_wait): (usize, Duration, Duration),
        checkpoints: Option<durable::Checkpoints>,
    ) -> Self {
        Puller {
            consumer,
            client,
            window,
            expires,
            reconnects,
            careful_until: None,
            careful_for: ack_wait + expires,
            redelivering: true,
            held: None,
            checkpoints,
        }
    }

    /// Makes a pull, once the acks of what was pulled before are out: a
    /// message that takes the process down must not take the acks of the
    /// messages before it down too (they would come back, and count an
    /// attempt, with every crash).
    pub(super) async fn pull(
        &mut self,
    ) -> std::result::Result<consumer::pull::Batch, consumer::pull::BatchError> {
        if let Err(err) = self.client.flush().await {
            tracing::debug!(error = %err, "NATS flush before a pull failed");
        }
        if let Some(checkpoints) = &mut self.checkpoints {
            checkpoints.due(&self.consumer);
        }
        self.reconnects.borrow_and_update();
        let careful = self.redelivering
            || self
                .careful_until
                .is_some_and(|until| Instant::now() < until);
        self.consumer
            .batch()
            .max_messages(if careful { 1 } else { self.window })
            .expires(self.expires)
            .messages()
            .await
    }

    /// A message of the open pull the client has already received, without
    /// waiting; `None` when there is none, when the pull is over or failed
    /// (`next` finds out), or when it is a redelivery, which waits in
    /// `held` for `next` to flush the acks before it.
    pub(super) fn try_next(
        &mut self,
        batch: &mut consumer::pull::Batch,
    ) -> Option<(jetstream::Message, u32)> {
        if self.held.is_some() {
            return None;
        }
        let Some(Some(Ok(message))) = batch.next().now_or_never() else {
            return None;
        };
        let attempt = ack_subject::attempt(&message);
        self.redelivering = attempt > 1;
        if self.redelivering {
            self.held = Some((message, attempt));
            return None;
        }
        Some((message, attempt))
    }

    /// What was received and never handed out (held back, or left in the
    /// open pull), for a subscription that goes away to give back.
    pub(super) fn received(
        &mut self,
        batch: Option<&mut consumer::pull::Batch>,
    ) -> Vec<jetstream::Message> {
        let mut received: Vec<_> = self.held.take().into_iter().map(|(m, _)| m).collect();
        if let Some(batch) = batch {
            while let Some(Some(Ok(message))) = batch.next().now_or_never() {
                received.push(message);
            }
        }
        received
    }

    /// The next message of the open pull; `None` once it is over: complete,
    /// expired, or lost with a connection that has come back since.
    ///
    /// A redelivery is handed out only once the acks of the messages before
    /// it are out: should it take the process down again, they stay acked.
    /// It waits in `held` meanwhile, so a call cancelled then loses nothing.
    pub(super) async fn next(
        &mut self,
        batch: &mut consumer::pull::Batch,
    ) -> Option<std::result::Result<(jetstream::Message, u32), async_nats::Error>> {
        if self.held.is_none() {
            let message = tokio::select! {
                biased;
                message = batch.next() => message?,
                Ok(()) = self.reconnects.changed() => {
                    self.careful_until = Some(Instant::now() + self.careful_for);
                    tracing::info!("NATS connection came back under an open JetStream pull: pulling again, one message at a time for a while");
                    return None;
                }
            };
            let message = match message {
                Ok(message) => message,
                Err(err) => return Some(Err(err)),
            };
            let attempt = ack_subject::attempt(&message);
            self.redelivering = attempt > 1;
            if !self.redelivering {
                return Some(Ok((message, attempt)));
            }
            self.held = Some((message, attempt));
        }
        if let Err(err) = self.client.flush().await {
            tracing::debug!(error = %err, "NATS flush before a redelivery failed");
        }
        self.held.take().map(Ok)
    }
}
