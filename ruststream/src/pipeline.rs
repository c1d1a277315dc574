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
use crate::exec::stop::Stop;
use crate::message::header;
use crate::subscriber::{Outcome, Scope, SendSubscriber, Subscriber, SubscriberConfig};
use crate::tasks::{self, FollowUps};
use crate::{BoxError, HandlerError, Message, Text, metrics};

/// Everything one subscriber's deliveries need, shared by its loop and its
/// workers or threads.
pub(crate) struct Unit<B, S> {
    pub(crate) broker: B,
    pub(crate) subscriber: S,
    pub(crate) config: SubscriberConfig,
    pub(crate) layers: Arc<[Arc<dyn AcceptLayer>]>,
    pub(crate) app: AppHandle,
    /// Set when the shutdown timeout expires (RT-10): a handler still running
    /// is dropped with its delivery unsettled, so the broker redelivers it.
    pub(crate) abort: Stop,
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
        self.abortable(async {
            let scope = Scope::new(delivery.envelope(), &self.app);
            let outcome = caught(self.subscriber.handle_send(body, &scope)).await;
            let follow_ups = scope.into_follow_ups();
            self.settle_outcome(delivery, outcome, follow_ups).await;
        })
        .await
    }
}

impl<B: Broker, S: Subscriber> Unit<B, S> {
    /// Accept layers and decode. `None` when the delivery was settled here
    /// (rejected by a layer, or malformed).
    pub(crate) async fn prepare<D: Delivery>(&self, delivery: D) -> Option<(D, S::Body)> {
        let env = delivery.envelope();
        if let Some(delay) = env.retry_delay() {
            // A `retry_after` a shutdown published early: re-arm its timer
            // for the delay it still had (RT-10).
            let env = env.clone();
            let acked = delivery.ack().await;
            if acked.is_ok() {
                tasks::schedule_retry(&self.broker, &self.app, &env, delay);
            }
            self.settled(acked);
            return None;
        }
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
        self.abortable(async {
            let scope = Scope::new(delivery.envelope(), &self.app);
            let outcome = caught(self.subscriber.handle(body, &scope)).await;
            let follow_ups = scope.into_follow_ups();
            self.settle_outcome(delivery, outcome, follow_ups).await;
        })
        .await
    }

    /// Runs `work` unless the shutdown timeout aborts it first (RT-10). An
    /// aborted handler's delivery is dropped unsettled: never acked.
    async fn abortable(&self, work: impl Future<Output = ()>) {
        tokio::select! {
            biased;
            () = work => {}
            () = self.abort.wait() => {
                tracing::warn!(subject = %self.config.subject, "handler aborted by the shutdown timeout; delivery left unsettled");
            }
        }
    }

    async fn settle_outcome<D: Delivery>(
        &self,
        delivery: D,
        outcome: Outcome,
        follow_ups: Option<Arc<FollowUps>>,
    ) {
        let retry = follow_ups.as_ref().and_then(|f| f.retry_requested());
        let outcome = match (outcome, retry) {
            (Outcome::Ack(_), Some(_))
                if delivery.envelope().total_attempt() >= self.config.max_attempts =>
            {
                Outcome::Failed(HandlerError::reject(format!(
                    "retry_after asked for attempt {} past max_attempts {}",
                    delivery.envelope().total_attempt() + 1,
                    self.config.max_attempts
                )))
            }
            (outcome, _) => outcome,
        };
        match outcome {
            Outcome::Ack(reply) => {
                if let Some(reply) = reply {
                    self.reply(&delivery, Message::new(reply), "ok").await;
                }
                // Follow-ups start after the ack (RT-8): keep what they need.
                let env = (retry.is_some() || self.app.has_after_ack())
                    .then(|| delivery.envelope().clone());
                let acked = delivery.ack().await;
                let ok = acked.is_ok();
                self.settled(acked);
                if let (true, Some(env)) = (ok, env) {
                    if let Some(delay) = retry {
                        tasks::schedule_retry(&self.broker, &self.app, &env, delay);
                    }
                    self.app.acked(&env);
                }
                if let Some(follow_ups) = follow_ups {
                    follow_ups.settled(ok);
                }
            }
            Outcome::Failed(err) => {
                if let Some(follow_ups) = follow_ups {
                    follow_ups.settled(false);
                }
                self.failed(delivery, err).await;
            }
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
        let attempt = env.total_attempt();
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
        if self.config.fail_fast {
            tracing::error!(subject = %self.config.subject, "fail-fast subscriber gave up a message: shutting the app down");
            self.app.request_shutdown();
        }
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
