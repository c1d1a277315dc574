//! One delivery, start to settlement (RT-7): context → accept layers → decode →
//! handler → reply → ack. Malformed input stops before the handler (JQ-13);
//! handler errors and panics end in `nack` until `max_attempts`, then `reject`.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;

use crate::accept::{AcceptLayer, Verdict};
use crate::binding::{Broker, Delivery};
use crate::message::header;
use crate::subscriber::{Outcome, Subscriber, SubscriberConfig};
use crate::{BoxError, HandlerError, Message, Text, metrics};

/// Everything one subscriber's deliveries need, shared by its loop (and, in
/// later modes, its workers).
pub(crate) struct Unit<B, S> {
    pub(crate) broker: B,
    pub(crate) subscriber: S,
    pub(crate) config: SubscriberConfig,
    pub(crate) layers: Arc<[Arc<dyn AcceptLayer>]>,
}

impl<B: Broker, S: Subscriber> Unit<B, S> {
    /// Processes one delivery to its settlement. Never panics on handler
    /// failure; settlement failures are logged and counted.
    pub(crate) async fn process<D: Delivery>(&self, delivery: D) {
        let env = delivery.envelope();
        for layer in self.layers.iter() {
            match layer.accept(env) {
                Verdict::Accept => {}
                Verdict::Skip => return self.settle(delivery.ack().await),
                Verdict::Retry => return self.settle(delivery.nack().await),
                Verdict::Reject(reason) => {
                    metrics::rejected(&self.config.subject);
                    return self.settle(delivery.reject(&reason).await);
                }
            }
        }
        let body = match self.subscriber.decode(env.payload()) {
            Ok(body) => body,
            Err(err) => return self.malformed(delivery, err).await,
        };
        let outcome = AssertUnwindSafe(self.subscriber.handle(body, env))
            .catch_unwind()
            .await
            .unwrap_or_else(|panic| Outcome::Failed(HandlerError::panic(panic_message(&*panic))));
        match outcome {
            Outcome::Ack(reply) => {
                if let Some(reply) = reply {
                    self.reply(&delivery, Message::new(reply), "ok").await;
                }
                self.settle(delivery.ack().await);
            }
            Outcome::Failed(err) => self.failed(delivery, err).await,
        }
    }

    /// JQ-13: a payload that does not decode never reaches the handler. A
    /// request gets a `protocol-error` reply; the message is rejected (to the
    /// dead-letter subject when configured), logged and counted.
    async fn malformed<D: Delivery>(&self, delivery: D, err: BoxError) {
        let env = delivery.envelope();
        metrics::malformed(&self.config.subject);
        tracing::warn!(
            subject = %env.subject(),
            error = %err,
            "malformed payload rejected before the handler"
        );
        let reason = format!("malformed payload: {err}");
        self.reply(&delivery, error_reply(&reason), "protocol-error")
            .await;
        metrics::rejected(&self.config.subject);
        self.settle(delivery.reject(&reason).await);
    }

    /// A failed handler: redeliver while attempts remain and the error allows
    /// it, else reject (never an endless redelivery loop).
    async fn failed<D: Delivery>(&self, delivery: D, err: HandlerError) {
        let env = delivery.envelope();
        metrics::handler_error(&self.config.subject);
        let attempt = env.attempt();
        if err.is_retry() && attempt < self.config.max_attempts {
            tracing::warn!(
                subject = %env.subject(),
                attempt,
                max_attempts = self.config.max_attempts,
                error = %err,
                "handler failed; redelivering"
            );
            return self.settle(delivery.nack().await);
        }
        tracing::error!(
            subject = %env.subject(),
            attempt,
            error = %err,
            "handler failed; message rejected"
        );
        let reason = format!("handler failed at attempt {attempt}: {err}");
        self.reply(&delivery, error_reply(&reason), "handler-error")
            .await;
        metrics::rejected(&self.config.subject);
        self.settle(delivery.reject(&reason).await);
    }

    /// Publishes a reply when the delivery is a request. A reply that cannot be
    /// published is logged: the caller's own timeout reports it.
    async fn reply<D: Delivery>(&self, delivery: &D, message: Message, status: &'static str) {
        let env = delivery.envelope();
        let Some(reply_to) = env.reply_to() else {
            return;
        };
        let mut message = message.with_header(header::STATUS, Text::from_static(status));
        if let Some(id) = env.correlation_id() {
            message = message.with_correlation_id(id.clone());
        }
        if let Err(err) = self.broker.publish_message(reply_to, message, None).await {
            tracing::warn!(subject = %env.subject(), reply_to = %reply_to, error = %err, "reply not published");
        }
    }

    fn settle(&self, result: crate::Result<()>) {
        if let Err(err) = result {
            metrics::settle_error(&self.config.subject);
            tracing::warn!(subject = %self.config.subject, error = %err, "settlement failed");
        }
    }
}

fn error_reply(reason: &str) -> Message {
    Message::new(bytes::Bytes::new()).with_header(header::ERROR, reason)
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_owned()
    }
}
