//! One delivery, start to settlement: context → accept layers → decode →
//! handler → reply → ack. Malformed input stops before the handler;
//! handler errors and panics end in `nack` until `max_attempts`, then `reject`.
//! A delivery already past `max_attempts` — its handler never settled it,
//! because the process died in it — is dead-lettered before the handler.
//!
//! The steps are split so execution modes can run them where they belong:
//! [`Unit::check`] (layers and decode, synchronous; [`Unit::settle_early`]
//! settles what stops there), then `invoke!` (handler to settlement).

use std::sync::Arc;

use crate::accept::{AcceptLayer, Verdict};
use crate::binding::{Broker, Delivery, RetryAfter};
use crate::host::{Abort, AppHandle};
use crate::message::header;
use crate::metrics::Handled;
use crate::middleware::HandlerService;
pub(crate) use crate::subscriber::Outcome;
use crate::subscriber::{Subscriber, SubscriberConfig};
use crate::tasks::{self, FollowUps};
use crate::{BoxError, HandlerError, metrics, spans};
use tracing::Instrument;

mod invoke;
mod reply;
pub(crate) mod stack;

pub(crate) use invoke::{Caught, HandOver, invoke, or_abort};

use reply::{SKIPPED, error_reply};

/// Everything one subscriber's deliveries need, shared by its loop and its
/// workers or threads.
pub(crate) struct Unit<B, S> {
    pub(crate) broker: B,
    pub(crate) subscriber: Arc<S>,
    pub(crate) config: SubscriberConfig,
    /// The middleware stack around the handler; `None` without middleware,
    /// and the handler is called directly.
    pub(crate) service: Option<HandlerService>,
    pub(crate) layers: Arc<[Arc<dyn AcceptLayer>]>,
    pub(crate) app: AppHandle,
    /// Set when the shutdown timeout expires: a handler still running
    /// is dropped with its delivery unsettled, so the broker redelivers it.
    pub(crate) abort: Abort,
    /// Outcome counts; with timings on, the handler runs on the stack path
    /// (`stack.rs`), which times it, so this path reads no clock.
    pub(crate) metrics: Arc<metrics::UnitMetrics>,
    /// A tracing subscriber wanted spans when this unit started: each
    /// delivery runs in its `process` span, on the stack path (or, for
    /// `!Send` handlers, on [`Unit::traced_local`]), never on the fast one.
    pub(crate) traced: bool,
    /// The app has an after-ack hook (fixed once it starts): read for every
    /// delivery, so kept here rather than behind the app handle.
    pub(crate) after_ack: bool,
}

/// What [`Unit::check`] decided before the handler.
pub(crate) enum Checked<B> {
    /// Decoded: the handler runs.
    Body(B),
    /// Settled before the handler, out of line (see [`Unit::settle_early`]).
    Early(Early),
}

/// A delivery that never reaches the handler.
pub(crate) enum Early {
    /// A `retry_after` a shutdown published early, with the delay it still had.
    RetryDelay(std::time::Duration),
    /// An accept layer said skip (ack), retry (nack) or reject.
    Layer(Verdict),
    /// The payload did not decode.
    Malformed(BoxError),
    /// Headers + payload exceed the subscriber's `max_message_size`:
    /// refused before decode.
    Oversized(usize),
    /// Delivered more often than `max_attempts` allows (the attempt it
    /// carries): every earlier run ended without a settlement, so the
    /// handler does not get another one.
    Exhausted(u32),
}

impl<B: Broker, S: Subscriber> Unit<B, S> {
    /// Accept layers and decode, synchronously: settling what stops here is
    /// left to [`settle_early`](Self::settle_early), out of line.
    #[inline(always)]
    pub(crate) fn check<D: Delivery>(&self, delivery: &D) -> Checked<S::Body> {
        let env = delivery.envelope();
        let early = if !env.message().has_headers() {
            // No headers (the common case): its size is its payload, its
            // attempt the broker's, and no header delays or types it; one
            // branch instead of a header lookup per step.
            let size = env.payload().len();
            if size > self.config.max_message_size {
                return Checked::Early(Early::Oversized(size));
            }
            let attempt = env.attempt();
            if attempt > self.config.max_attempts {
                return Checked::Early(Early::Exhausted(attempt));
            }
            self.accept(env)
        } else {
            self.check_headers(env)
        };
        if let Some(early) = early {
            return Checked::Early(early);
        }
        match self.subscriber.decode(env.payload()) {
            Ok(body) => Checked::Body(body),
            Err(err) => Checked::Early(Early::Malformed(err)),
        }
    }

    /// The accept layers' verdict, unless every layer accepts.
    #[inline]
    fn accept(&self, env: &crate::Envelope) -> Option<Early> {
        self.layers
            .iter()
            .map(|layer| layer.accept(env))
            .find(|verdict| !matches!(verdict, Verdict::Accept))
            .map(Early::Layer)
    }

    /// [`check`](Self::check)'s steps that read a message's headers: its
    /// size with headers, the attempts `retry_after` made, a delay a
    /// shutdown left, and the content type. The accept layers run after the
    /// first three and before the last, as on a message without headers.
    #[inline]
    fn check_headers(&self, env: &crate::Envelope) -> Option<Early> {
        let size = env.frame_bytes() - crate::message::FRAME_OVERHEAD;
        if size > self.config.max_message_size {
            return Some(Early::Oversized(size));
        }
        let attempt = env.total_attempt();
        if attempt > self.config.max_attempts {
            return Some(Early::Exhausted(attempt));
        }
        if let Some(delay) = env.retry_delay() {
            return Some(Early::RetryDelay(delay));
        }
        if let Some(early) = self.accept(env) {
            return Some(early);
        }
        let expected = self.subscriber.content_type()?;
        let got = env.headers().get(header::CONTENT_TYPE)?;
        (!crate::codec::same_media_type(got, expected))
            .then(|| Early::Malformed(wrong_content_type(got, expected)))
    }

    /// Settles a delivery that stops before the handler (in its span, when
    /// traced).
    pub(crate) async fn settle_early<D: Delivery>(&self, delivery: D, early: Early) {
        if self.traced {
            let span = self.span(delivery.envelope());
            return self
                .settle_early_here(delivery, early)
                .instrument(span)
                .await;
        }
        self.settle_early_here(delivery, early).await
    }

    async fn settle_early_here<D: Delivery>(&self, delivery: D, early: Early) {
        match early {
            Early::RetryDelay(delay) => {
                // A `retry_after` a shutdown published early: re-arm its timer
                // for the delay it still had (RT-10).
                let env = delivery.envelope().clone();
                match delivery.retry_after(delay).await {
                    RetryAfter::Held(result) => {
                        self.record("delayed");
                        self.settled(result)
                    }
                    RetryAfter::NotHeld(delivery) => {
                        self.record("delayed");
                        // The envelope is at hand already: no second copy
                        // for the after-ack hook.
                        let acked = delivery.ack().await;
                        if acked.is_ok() {
                            tasks::schedule_retry(&self.broker, &self.app, &env, delay);
                            self.app.acked(&env);
                        }
                        self.settled(acked);
                    }
                }
            }
            Early::Layer(Verdict::Accept) => {
                unreachable!("an accepted delivery is not settled early")
            }
            Early::Layer(Verdict::Skip) => {
                // A request's caller hears that nothing will answer it,
                // rather than waiting out its timeout.
                self.reply(&delivery, error_reply(SKIPPED), Some("handler-error"))
                    .await;
                self.acked();
                self.settled(self.ack_early(delivery).await);
            }
            Early::Layer(Verdict::Retry) => {
                self.handled(Handled::Retried);
                self.settled(delivery.nack().await);
            }
            Early::Layer(Verdict::Reject(reason)) => {
                tracing::warn!(subject = %delivery.envelope().subject(), reason, dead_letter = self.dead_letter(), "an accept layer rejected the message");
                // A request's caller hears why, rather than waiting out
                // its timeout.
                self.reply(&delivery, error_reply(&reason), Some("handler-error"))
                    .await;
                self.handled(Handled::DeadLettered);
                metrics::rejected(self.metrics.app(), &self.config.subject);
                self.settled(delivery.reject(&reason).await);
            }
            Early::Malformed(err) => self.malformed(delivery, err).await,
            Early::Oversized(size) => {
                self.handled(Handled::DeadLettered);
                metrics::oversized(self.metrics.app(), &self.config.subject);
                let err = format!(
                    "message of {size} bytes (headers + payload) exceeds max_message_size {}",
                    self.config.max_message_size
                );
                self.refused(delivery, err.into()).await;
            }
            Early::Exhausted(attempt) => self.exhausted(delivery, attempt).await,
        }
    }

    /// A delivery past `max_attempts` whose earlier runs never settled (a
    /// handler that aborts the process, a client that fails before the
    /// handler): dead-lettered without running the handler again, so a
    /// crash loop ends.
    #[cold]
    async fn exhausted<D: Delivery>(&self, delivery: D, attempt: u32) {
        self.handled(Handled::DeadLettered);
        metrics::exhausted(self.metrics.app(), &self.config.subject);
        let reason = format!(
            "attempts exhausted: delivered {attempt} times, max_attempts {}, and no \
             earlier run settled it (did the handler crash the process?)",
            self.config.max_attempts
        );
        tracing::error!(subject = %delivery.envelope().subject(), attempt, dead_letter = self.dead_letter(), "{reason}; message rejected before the handler");
        self.reply(&delivery, error_reply(&reason), Some("handler-error"))
            .await;
        metrics::rejected(self.metrics.app(), &self.config.subject);
        self.settled(delivery.reject(&reason).await);
    }

    #[cold]
    /// A delivery taken before the shutdown timeout and still waiting to
    /// run past it (in a by-key FIFO, a thread's ring, a batch): its handler
    /// never starts, and it is left unsettled for the broker to redeliver
    /// (RT-10). Loops that take one delivery at a time need no such look:
    /// after the stop they take nothing new.
    pub(crate) fn not_started<T>(&self, delivery: T) {
        tracing::debug!(subject = %self.config.subject, "shutdown timeout expired: delivery not started, left unsettled");
        drop(delivery);
    }

    pub(crate) fn aborted(&self) {
        tracing::warn!(subject = %self.config.subject, "handler aborted by the shutdown timeout; delivery left unsettled");
    }

    pub(crate) async fn settle_outcome<D: Delivery>(
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
                self.acked();
                if let Some(reply) = reply {
                    self.reply(&delivery, self.reply_message(reply), None).await;
                }
                // Follow-ups start after the ack (RT-8): keep what they need.
                let env = (retry.is_some() || self.after_ack).then(|| delivery.envelope().clone());
                let (acked, timer) = match retry {
                    Some(delay) => match delivery.retry_after(delay).await {
                        // The broker holds the retry: no timer here.
                        RetryAfter::Held(result) => (result, None),
                        RetryAfter::NotHeld(delivery) => (delivery.ack().await, Some(delay)),
                    },
                    None => (delivery.ack().await, None),
                };
                let ok = acked.is_ok();
                self.settled(acked);
                if let (true, Some(env)) = (ok, env) {
                    if let Some(delay) = timer {
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
                // Out of line: the failure path's futures never inflate the
                // settlement of a success.
                Box::pin(self.failed(delivery, err)).await;
            }
        }
    }

    /// a payload that does not decode never reaches the handler. A
    /// request gets a `protocol-error` reply; the message is rejected (to the
    /// dead-letter subject when configured), logged and counted.
    async fn malformed<D: Delivery>(&self, delivery: D, err: BoxError) {
        self.handled(Handled::Malformed);
        metrics::malformed(self.metrics.app(), &self.config.subject);
        self.refused(delivery, format!("malformed payload: {err}").into())
            .await;
    }

    /// A record refused before decode (malformed, oversized): a request
    /// caller gets `Error::Protocol`, a one-way message is rejected and only
    /// recorded. The handler never sees it.
    async fn refused<D: Delivery>(&self, delivery: D, err: BoxError) {
        let env = delivery.envelope();
        tracing::warn!(
            subject = %env.subject(),
            error = %err,
            dead_letter = self.dead_letter(),
            "payload refused before the handler"
        );
        let reason = err.to_string();
        // The reply carries its status already.
        let reply = crate::binding::protocol_error_reply(&reason);
        self.reply(&delivery, reply, None).await;
        metrics::rejected(self.metrics.app(), &self.config.subject);
        self.settled(delivery.reject(&reason).await);
    }

    /// A request its owner FIFO refused: the caller gets
    /// `Error::StructuralLimit` at once, and the delivery is settled — the
    /// refusal is its outcome, told to the one caller that can act on it.
    /// `reason` is said once, in plain words: the caller's error adds what
    /// kind of failure it is.
    pub(crate) async fn refuse<D: Delivery>(&self, delivery: D, reason: &str) {
        if self.traced {
            let span = self.span(delivery.envelope());
            return self.refuse_here(delivery, reason).instrument(span).await;
        }
        self.refuse_here(delivery, reason).await
    }

    async fn refuse_here<D: Delivery>(&self, delivery: D, reason: &str) {
        self.handled(Handled::Refused);
        metrics::structural_reject(self.metrics.app(), &self.config.subject);
        tracing::warn!(subject = %self.config.subject, reason, "request refused by a structural limit");
        self.reply(&delivery, error_reply(reason), Some("structural-limit"))
            .await;
        self.settled(self.ack_early(delivery).await);
    }

    /// Acks a delivery its handler never ran for, and starts the after-ack
    /// hook for it: the hook sees every acked delivery (RT-8).
    async fn ack_early<D: Delivery>(&self, delivery: D) -> crate::Result<()> {
        let env = self.after_ack.then(|| delivery.envelope().clone());
        let acked = delivery.ack().await;
        if let (Ok(()), Some(env)) = (&acked, env) {
            self.app.acked(&env);
        }
        acked
    }

    /// A failed handler: redeliver while attempts remain and the error allows
    /// it, else reject (never an endless redelivery loop).
    async fn failed<D: Delivery>(&self, delivery: D, err: HandlerError) {
        let env = delivery.envelope();
        metrics::handler_error(self.metrics.app(), &self.config.subject);
        let attempt = env.total_attempt();
        let stage = if err.is_before_handler() {
            "an extractor refused the delivery"
        } else {
            "handler failed"
        };
        if err.is_retry() && attempt < self.config.max_attempts {
            tracing::warn!(
                subject = %env.subject(),
                attempt,
                max_attempts = self.config.max_attempts,
                error = %err,
                "{stage}; redelivering"
            );
            self.handled(Handled::Retried);
            return self.settled(delivery.nack().await);
        }
        if !err.is_retry() && env.expects_reply() {
            // A request the handler turned down: its caller gets the error
            // and decides; the service itself did nothing wrong.
            tracing::warn!(subject = %env.subject(), attempt, error = %err, dead_letter = self.dead_letter(), "{stage}; request rejected");
        } else {
            tracing::error!(subject = %env.subject(), attempt, error = %err, dead_letter = self.dead_letter(), "{stage}; message rejected");
        }
        let reason = if err.is_before_handler() {
            format!("refused before the handler at attempt {attempt}: {err}")
        } else {
            format!("handler failed at attempt {attempt}: {err}")
        };
        self.reply(&delivery, error_reply(&reason), Some("handler-error"))
            .await;
        self.handled(Handled::DeadLettered);
        metrics::rejected(self.metrics.app(), &self.config.subject);
        self.settled(delivery.reject(&reason).await);
        if self.config.fail_fast {
            tracing::error!(subject = %self.config.subject, "fail-fast subscriber gave up a message: shutting the app down");
            self.app.request_shutdown();
        }
    }

    /// Where a rejected delivery goes, for the log line that says so.
    fn dead_letter(&self) -> &str {
        self.config
            .dead_letter
            .as_ref()
            .map_or("none: the message is dropped", |s| s.as_str())
    }

    /// The span of a delivery of this unit.
    pub(crate) fn span(&self, env: &crate::Envelope) -> tracing::Span {
        spans::process(self.broker.name(), self.subscriber.name(), env)
    }

    /// A delivery acked, counted (and told to its span).
    #[inline]
    pub(crate) fn acked(&self) {
        self.metrics.acked();
        self.record("acked");
    }

    /// A delivery that ended otherwise, counted (and told to its span).
    fn handled(&self, how: Handled) {
        self.metrics.handled(how);
        self.record(how.as_str());
    }

    /// Tells the current delivery's span how it ended (one branch when
    /// untraced: the ack path takes it on every request).
    #[inline]
    fn record(&self, outcome: &'static str) {
        if self.traced {
            record_outcome(outcome);
        }
    }

    #[inline]
    pub(crate) fn settled(&self, result: crate::Result<()>) {
        if let Err(err) = result {
            self.settle_failed(err);
        }
    }

    #[cold]
    fn settle_failed(&self, err: crate::Error) {
        metrics::settle_error(self.metrics.app(), &self.config.subject);
        tracing::warn!(subject = %self.config.subject, error = %err, "settlement failed");
    }
}

#[cold]
#[inline(never)]
fn record_outcome(outcome: &'static str) {
    spans::outcome(&tracing::Span::current(), outcome);
}

/// Out of line: the error of a delivery in a format the subscriber does not
/// read.
#[cold]
#[inline(never)]
fn wrong_content_type(got: &str, expected: &str) -> BoxError {
    format!("content type `{got}`, and this subscriber reads `{expected}`").into()
}
