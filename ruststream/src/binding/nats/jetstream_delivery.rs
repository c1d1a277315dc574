//! A delivery from a JetStream pull consumer: acked, nak'ed (with or
//! without a delay), terminated or dead-lettered through its ack subject,
//! and nak'ed soon when dropped unsettled.

use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use async_nats::jetstream::{self, AckKind};

use super::convert;
use super::jetstream::Shared;
use crate::binding::{Broker, Delivery, RetryAfter};
use crate::{Envelope, Error, Result};

/// How soon a delivery dropped unsettled comes back. Not at once: an
/// immediate nak can be handed straight back to the pull of the
/// subscription that is going away, and nats-server (seen with 2.9.10) then
/// takes that delivery back and forgets the earlier one, so the next
/// consumer would see attempt 1 for a message delivered twice. A nak with
/// a delay goes through the server's redelivery timer and keeps the count.
const UNSETTLED_REDELIVERY: Duration = Duration::from_millis(50);

/// A delivery from a JetStream pull consumer. Dropped unsettled, it is
/// nak'ed so the server redelivers it soon, not only after `ack_wait`.
pub struct JetStreamDelivery {
    env: Envelope,
    acker: Option<jetstream::message::Acker>,
    shared: Arc<Shared>,
}

impl JetStreamDelivery {
    /// A received message on its `attempt` (the server's delivery count,
    /// read once where it is received).
    pub(super) fn new(
        message: jetstream::Message,
        attempt: u32,
        subjects: &mut convert::SubjectCache,
        shared: &Arc<Shared>,
    ) -> Self {
        let (message, acker) = message.split();
        let subject = subjects.text(message.subject.as_str());
        let body = convert::message(message.payload, message.headers.as_ref(), None);
        JetStreamDelivery {
            env: Envelope::new(subject, body).with_attempt(attempt),
            acker: Some(acker),
            shared: Arc::clone(shared),
        }
    }

    async fn settle(mut self, kind: AckKind) -> Result<()> {
        let Some(acker) = self.acker.take() else {
            return Ok(());
        };
        acker.ack_with(kind).await.map_err(Error::Transport)
    }

    /// Nak with a delay: the server redelivers the message, with the
    /// delivery count (the attempt) plus one, no sooner than `delay` from
    /// now. JetStream keeps the delay, so it survives a restart of this
    /// process.
    pub async fn nack_after(self, delay: Duration) -> Result<()> {
        self.settle(AckKind::Nak(Some(delay))).await
    }
}

impl Delivery for JetStreamDelivery {
    fn envelope(&self) -> &Envelope {
        &self.env
    }

    async fn ack(self) -> Result<()> {
        self.settle(AckKind::Ack).await
    }

    /// Acks at once when the client's write buffer has room: the ack's
    /// first poll either hands `+ACK` to the client or sends nothing.
    fn try_ack(&mut self) -> Option<Result<()>> {
        let Some(acker) = &self.acker else {
            return Some(Ok(()));
        };
        let mut cx = Context::from_waker(Waker::noop());
        let Poll::Ready(acked) = pin!(acker.ack_with(AckKind::Ack)).poll(&mut cx) else {
            return None;
        };
        self.acker = None;
        Some(acked.map_err(Error::Transport))
    }

    /// Redelivered by the server, with its delivery count as the attempt.
    async fn nack(self) -> Result<()> {
        self.settle(AckKind::Nak(None)).await
    }

    /// JetStream holds the delay: a nak with delay, so the retry survives a
    /// crash of this process. The server's delivery count is the attempt,
    /// so the retry counts as one more attempt (not in `retries`).
    ///
    /// A copy a shutdown published early (it carries its remaining delay in
    /// a header) is handed back: a nak would bring back the header with it,
    /// again and again; the runtime republishes it without.
    async fn retry_after(self, delay: Duration) -> RetryAfter<Self> {
        if self.env.retry_delay().is_some() {
            return RetryAfter::NotHeld(self);
        }
        RetryAfter::Held(self.nack_after(delay).await)
    }

    /// Dead-letters (where configured) and terminates: never redelivered.
    /// If the dead-letter publish fails the message is nak'ed instead, so it
    /// is not lost.
    async fn reject(self, reason: &str) -> Result<()> {
        if let Some(dead_letter) = self.shared.dead_letter.clone() {
            let message = super::core::dead_letter_message(self.env.clone(), reason);
            if let Err(err) = self
                .shared
                .nats
                .publish_message(&dead_letter, message, None)
                .await
            {
                self.settle(AckKind::Nak(None)).await?;
                return Err(err);
            }
        } else {
            tracing::warn!(
                subject = %self.env.subject(),
                attempt = self.env.attempt(),
                reason,
                "message rejected and terminated (no dead-letter subject configured)"
            );
        }
        self.settle(AckKind::Term).await
    }
}

impl Drop for JetStreamDelivery {
    fn drop(&mut self) {
        // Unsettled (a handler aborted by the shutdown timeout, a dropped
        // consumer): ask for redelivery soon.
        if let Some(acker) = self.acker.take() {
            nak_soon(acker);
        }
    }
}

/// Asks the server to redeliver a message soon. Spawned, as a drop cannot
/// wait; without a runtime the server redelivers after `ack_wait` anyway.
pub(super) fn nak_soon(acker: jetstream::message::Acker) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let nak = AckKind::Nak(Some(UNSETTLED_REDELIVERY));
            if let Err(err) = acker.ack_with(nak).await {
                tracing::debug!(error = %err, "nak of an unsettled JetStream delivery failed");
            }
        });
    }
}
