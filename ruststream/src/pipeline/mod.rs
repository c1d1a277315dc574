//! One delivery, start to settlement: context → accept layers → decode →
//! handler → reply → ack. Malformed input stops before the handler;
//! handler errors and panics end in `nack` until `max_attempts`, then `reject`.
//! A delivery already past `max_attempts` — its handler never settled it,
//! because the process died in it — is dead-lettered before the handler.
//!
//! The steps are split so execution modes can run them where they belong:
//! [`Unit::check`] (layers and decode, synchronous; [`Unit::settle_early`]
//! settles what stops there), then `invoke!` (handler to settlement).

use std::any::Any;
use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use crate::accept::{AcceptLayer, Verdict};
use crate::binding::{Broker, Delivery, RetryAfter};
use crate::host::{Abort, AppHandle};
use crate::ingress::{BorrowedPermit, JobPermit, JobQueue};

use crate::message::header;
use crate::metrics::Handled;
use crate::middleware::HandlerService;
pub(crate) use crate::subscriber::Outcome;
use crate::subscriber::{Subscriber, SubscriberConfig};
use crate::tasks::{self, FollowUps};
use crate::{BoxError, HandlerError, metrics, spans};
use tracing::Instrument;

mod reply;
pub(crate) mod stack;

use reply::error_reply;

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

/// Runs one handler future, with panics caught, and its settlement, unless
/// the shutdown timeout aborts it first: an aborted delivery is
/// dropped unsettled, never acked.
///
/// A macro rather than an `async fn` so that a loop can run a delivery inside
/// its own future instead of moving a whole pipeline future into it for every
/// delivery; and the handler future borrows the scope, which borrows the
/// delivery. `$unit` is a `&Unit`; `$handler` is `handle_send` or `handle`.
///
/// JQ-4 step 5: the delivery's job permit returns right before the handler.
/// `$permit` is a [`HandOver`] (or, spelled out, `release:` returns it and
/// `hand_over:` makes it an owned [`JobPermit`]): without middleware it is
/// returned here, right before the handler is called; with middleware it
/// travels through the stack and returns inside it, right before the
/// handler, so a delivery a layer holds up (a concurrency limit) still
/// counts in the job queue.
macro_rules! invoke {
    ($unit:expr, $delivery:expr, $handler:ident($body:expr), $permit:expr) => {
        $crate::pipeline::invoke!(
            $unit,
            $delivery,
            $handler($body),
            release: drop($permit),
            hand_over: $crate::pipeline::HandOver::hand_over($permit, $unit.app.jobs())
        )
    };
    ($unit:expr, $delivery:expr, $handler:ident($body:expr), release: $release:expr, hand_over: $hand_over:expr) => {{
        let unit = $unit;
        let delivery = $delivery;
        match &unit.service {
            // Out of line and boxed: without middleware, a loop's future
            // and code stay what they are.
            Some(service) => {
                let permit = $hand_over;
                ::std::boxed::Box::pin(unit.through_stack(
                    service,
                    delivery,
                    ::std::boxed::Box::new($body),
                    permit,
                ))
                .await
            }
            None => {
                $release;
                // Not started (so not registered anywhere, and not even
                // built: the token's wait registers with a `Notify` when
                // made) unless something waits.
                let mut aborted = ::std::pin::pin!(async { unit.abort.cancelled().await });
                let scope = $crate::subscriber::Scope::new(
                    $crate::Delivery::envelope(&delivery),
                    &unit.app,
                    &unit.broker,
                );
                let outcome = {
                    let handler = ::std::pin::pin!(unit.subscriber.$handler($body, &scope));
                    $crate::pipeline::or_abort($crate::pipeline::Caught(handler), aborted.as_mut())
                        .await
                };
                match outcome {
                    Some(outcome) => match (outcome, scope.into_follow_ups()) {
                        // The common case, settled right here: a plain ack,
                        // nothing to reply, nothing to start after it.
                        ($crate::pipeline::Outcome::Ack(None), None)
                            if !unit.app.has_after_ack() =>
                        {
                            unit.metrics.acked();
                            match $crate::Delivery::try_ack(delivery) {
                                Ok(acked) => unit.settled(acked),
                                Err(delivery) => {
                                    let ack = ::std::pin::pin!($crate::Delivery::ack(delivery));
                                    match $crate::pipeline::or_abort(ack, aborted).await {
                                        Some(acked) => unit.settled(acked),
                                        None => unit.aborted(),
                                    }
                                }
                            }
                        }
                        (outcome, follow_ups) => {
                            let settle = ::std::pin::pin!(
                                unit.settle_outcome(delivery, outcome, follow_ups)
                            );
                            if $crate::pipeline::or_abort(settle, aborted).await.is_none() {
                                unit.aborted();
                            }
                        }
                    },
                    None => unit.aborted(),
                }
            }
        }
    }};
}
pub(crate) use invoke;

/// A delivery's job permit as [`invoke!`] hands it into a middleware stack:
/// owned, so it can travel with the request to the handler.
pub(crate) trait HandOver {
    /// The permit, owning a reference to `jobs` (its own queue); `None` for
    /// a delivery that holds none.
    fn hand_over(self, jobs: &Arc<JobQueue>) -> Option<JobPermit>;
}

impl HandOver for BorrowedPermit<'_> {
    fn hand_over(self, jobs: &Arc<JobQueue>) -> Option<JobPermit> {
        Some(self.into_owned(jobs))
    }
}

impl HandOver for Option<JobPermit> {
    fn hand_over(self, _: &Arc<JobQueue>) -> Option<JobPermit> {
        self
    }
}

/// `work`, unless `aborted` resolves first: `work` is polled first, and
/// `aborted` only while `work` is pending.
#[inline]
pub(crate) fn or_abort<'a, F: Future + Unpin + 'a, A: Future<Output = ()>>(
    mut work: F,
    mut aborted: Pin<&'a mut A>,
) -> impl Future<Output = Option<F::Output>> + 'a {
    poll_fn(move |cx| {
        if let Poll::Ready(output) = Pin::new(&mut work).poll(cx) {
            return Poll::Ready(Some(output));
        }
        aborted.as_mut().poll(cx).map(|()| None)
    })
}

/// A handler future with its panics turned into retryable failures.
pub(crate) struct Caught<'a, F>(pub(crate) Pin<&'a mut F>);

impl<F: Future<Output = Outcome>> Future for Caught<'_, F> {
    type Output = Outcome;

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Outcome> {
        let handler = self.0.as_mut();
        match std::panic::catch_unwind(AssertUnwindSafe(|| handler.poll(cx))) {
            Ok(poll) => poll,
            Err(panic) => Poll::Ready(panicked(panic)),
        }
    }
}

impl<B: Broker, S: Subscriber> Unit<B, S> {
    /// Accept layers and decode, synchronously: settling what stops here is
    /// left to [`settle_early`](Self::settle_early), out of line.
    #[inline]
    pub(crate) fn check<D: Delivery>(&self, delivery: &D) -> Checked<S::Body> {
        let env = delivery.envelope();
        let size = env.frame_bytes() - crate::message::FRAME_OVERHEAD;
        if size > self.config.max_message_size {
            return Checked::Early(Early::Oversized(size));
        }
        let attempt = env.total_attempt();
        if attempt > self.config.max_attempts {
            return Checked::Early(Early::Exhausted(attempt));
        }
        if let Some(delay) = env.retry_delay() {
            return Checked::Early(Early::RetryDelay(delay));
        }
        for layer in self.layers.iter() {
            match layer.accept(env) {
                Verdict::Accept => {}
                verdict => return Checked::Early(Early::Layer(verdict)),
            }
        }
        if let Some(expected) = self.subscriber.content_type()
            && let Some(got) = env.headers().get(header::CONTENT_TYPE)
            && !crate::codec::same_media_type(got, expected)
        {
            return Checked::Early(Early::Malformed(wrong_content_type(got, expected)));
        }
        match self.subscriber.decode(env.payload()) {
            Ok(body) => Checked::Body(body),
            Err(err) => Checked::Early(Early::Malformed(err)),
        }
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
                let env = (retry.is_some() || self.app.has_after_ack())
                    .then(|| delivery.envelope().clone());
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
        let env = self
            .app
            .has_after_ack()
            .then(|| delivery.envelope().clone());
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
        if !err.is_retry() && env.reply_to().is_some() {
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

#[cold]
fn panicked(panic: Box<dyn Any + Send>) -> Outcome {
    Outcome::Failed(HandlerError::panic(panic_message(&*panic)))
}

/// Out of line: the error of a delivery in a format the subscriber does not
/// read.
#[cold]
#[inline(never)]
fn wrong_content_type(got: &str, expected: &str) -> BoxError {
    format!("content type `{got}`, and this subscriber reads `{expected}`").into()
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
