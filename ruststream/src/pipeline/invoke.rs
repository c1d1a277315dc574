//! One delivery through its handler: the [`invoke!`] step every loop runs
//! a delivery with, the job permit's hand-over into a middleware stack,
//! panics caught as failures, and the shutdown timeout's abort.

use std::any::Any;
use std::future::{Future, poll_fn};
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use super::Outcome;
use crate::HandlerError;
use crate::ingress::{BorrowedPermit, JobPermit, JobQueue};

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
    // The ack of a delivery whose handler succeeded: without waiting where
    // the binding can.
    (@ack $unit:ident, $delivery:ident, $aborted:ident) => {
        match $crate::Delivery::try_ack(&mut $delivery) {
            // The settled delivery is dropped in place where its scope
            // ends: `drop(..)` would move (copy) it first.
            Some(acked) => $unit.settled(acked),
            None => {
                let ack = ::std::pin::pin!($crate::Delivery::ack($delivery));
                match $crate::pipeline::or_abort(ack, $aborted).await {
                    Some(acked) => $unit.settled(acked),
                    None => $unit.aborted(),
                }
            }
        }
    };
    ($unit:expr, $delivery:ident, $handler:ident($body:expr), $permit:expr) => {
        $crate::pipeline::invoke!(
            $unit,
            $delivery,
            $handler($body),
            release: drop($permit),
            hand_over: $crate::pipeline::HandOver::hand_over($permit, $unit.app.jobs())
        )
    };
    ($unit:expr, $delivery:ident, $handler:ident($body:expr), release: $release:expr, hand_over: $hand_over:expr) => {{
        let unit = $unit;
        // `$delivery` is used in place, never rebound: a delivery is moved
        // only into its settlement (a move between two slots of the
        // loop's future is a copy of the whole delivery).
        match &unit.service {
            // Out of line and boxed: without middleware, a loop's future
            // and code stay what they are.
            Some(service) => {
                let permit = $hand_over;
                ::std::boxed::Box::pin(unit.through_stack(
                    service,
                    $delivery,
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
                    $crate::Delivery::envelope(&$delivery),
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
                            if !unit.after_ack =>
                        {
                            unit.metrics.acked();
                            $crate::pipeline::invoke!(@ack unit, $delivery, aborted);
                        }
                        // A reply, then the ack: the delivery is borrowed by
                        // the reply, not moved into a settlement future.
                        ($crate::pipeline::Outcome::Ack(Some(reply)), None)
                            if !unit.after_ack =>
                        {
                            unit.metrics.acked();
                            let message = unit.reply_message(reply);
                            let replied = match unit.reply_at_once(&$delivery, message) {
                                None => Some(()),
                                Some(message) => {
                                    let reply = ::std::pin::pin!(unit.reply(&$delivery, message, None));
                                    $crate::pipeline::or_abort(reply, aborted.as_mut()).await
                                }
                            };
                            match replied {
                                Some(()) => $crate::pipeline::invoke!(@ack unit, $delivery, aborted),
                                None => unit.aborted(),
                            }
                        }
                        (outcome, follow_ups) => {
                            let settle = ::std::pin::pin!(
                                unit.settle_outcome($delivery, outcome, follow_ups)
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

#[cold]
fn panicked(panic: Box<dyn Any + Send>) -> Outcome {
    Outcome::Failed(HandlerError::panic(panic_message(&*panic)))
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
