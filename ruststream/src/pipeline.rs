//! One delivery, start to settlement (RT-7): context → accept layers → decode →
//! handler → reply → ack. Malformed input stops before the handler (JQ-13);
//! handler errors and panics end in `nack` until `max_attempts`, then `reject`.
//!
//! The steps are split so execution modes can run them where they belong:
//! [`Unit::prepare`] (layers and decode) and [`Unit::invoke_send`] /
//! [`Unit::invoke_local`] (handler to settlement).

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures_util::FutureExt;

use crate::accept::{AcceptLayer, Verdict};
use crate::app::AppHandle;
use crate::binding::{Broker, Delivery};
use crate::message::header;
use crate::subscriber::{Outcome, Scope, SendSubscriber, Subscriber, SubscriberConfig};
use crate::{BoxError, HandlerError, Message, Text, metrics};

/// Everything one subscriber's deliveries need, shared by its loop and its
/// workers or threads.
pub(crate) struct Unit<B, S> {
    pub(crate) broker: B,
    pub(crate) subscriber: S,
    pub(crate) config: SubscriberConfig,
    pub(crate) layers: Arc<[Arc<dyn AcceptLayer>]>,
    pub(crate) app: AppHandle,
}

impl<B: Broker, S: SendSubscriber> Unit<B, S> {
    /// The whole pipeline for one delivery, as a `Send` future.
    pub(crate) async fn process<D: Delivery>(&self, delivery: D) {
        if let Some((delivery, body)) = self.prepare(delivery).await {
            self.invoke_send(delivery, body).await;
        }
    }

    /// Handler to settlement, as a `Send` future.
    pub(crate) async fn invoke_send<D: Delivery>(&self, delivery: D, body: S::Body) {
        let scope = self.scope(&delivery);
        let outcome = caught(self.subscriber.handle_send(body, &scope)).await;
        self.settle_outcome(delivery, outcome).await;
    }
}

impl<B: Broker, S: Subscriber> Unit<B, S> {
    /// Accept layers and decode. `None` when the delivery was settled here
    /// (rejected by a layer, or malformed).
    pub(crate) async fn prepare<D: Delivery>(&self, delivery: D) -> Option<(D, S::Body)> {
        let env = delivery.envelope();
        for layer in self.layers.iter() {
            match layer.accept(env) {
                Verdict::Accept => {}
                Verdict::Skip => {
                    self.settled(delivery.ack().await);
                    return None;
                }
                Verdict::Retry => {
                    self.settled(delivery.nack().await);
                    return None;
                }
                Verdict::Reject(reason) => {
                    metrics::rejected(&self.config.subject);
                    self.settled(delivery.reject(&reason).await);
                    return None;
                }
            }
        }
        match self.subscriber.decode(env.payload()) {
            Ok(body) => Some((delivery, body)),
            Err(err) => {
                self.malformed(delivery, err).await;
                None
            }
        }
    }

    /// The whole pipeline on a thread's own runtime: the handler future may
    /// be `!Send` (RT-5).
    pub(crate) async fn process_local<D: Delivery>(&self, delivery: D) {
        if let Some((delivery, body)) = self.prepare(delivery).await {
            self.invoke_local(delivery, body).await;
        }
    }

    /// Handler to settlement; the future may be `!Send`.
    pub(crate) async fn invoke_local<D: Delivery>(&self, delivery: D, body: S::Body) {
        let scope = self.scope(&delivery);
        let outcome = caught(self.subscriber.handle(body, &scope)).await;
        self.settle_outcome(delivery, outcome).await;
    }

    fn scope<'a, D: Delivery>(&'a self, delivery: &'a D) -> Scope<'a> {
        Scope {
            envelope: delivery.envelope(),
            app: &self.app,
        }
    }

    async fn settle_outcome<D: Delivery>(&self, delivery: D, outcome: Outcome) {
        match outcome {
            Outcome::Ack(reply) => {
                if let Some(reply) = reply {
                    self.reply(&delivery, Message::new(reply), "ok").await;
                }
                self.settled(delivery.ack().await);
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
        self.settled(delivery.reject(&reason).await);
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
            return self.settled(delivery.nack().await);
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
        self.settled(delivery.reject(&reason).await);
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

    fn settled(&self, result: crate::Result<()>) {
        if let Err(err) = result {
            metrics::settle_error(&self.config.subject);
            tracing::warn!(subject = %self.config.subject, error = %err, "settlement failed");
        }
    }
}

/// Runs a handler future, turning a panic into a retryable failure.
async fn caught(handler: impl Future<Output = Outcome>) -> Outcome {
    AssertUnwindSafe(handler)
        .catch_unwind()
        .await
        .unwrap_or_else(|panic| Outcome::Failed(HandlerError::panic(panic_message(&*panic))))
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
