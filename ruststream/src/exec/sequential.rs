//! The default loop (RT-2): one task per subscriber polls the next delivery
//! only after the previous one is settled, so at most one delivery is in
//! flight and backpressure is simply not polling.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Poll, ready};

use super::stop::Stop;
use crate::binding::{Broker, Subscription};
use crate::pipeline::{Checked, Unit, invoke};
use crate::subscriber::SendSubscriber;

/// The next delivery, or `None` once `stop` was called or the subscription
/// ended, taken inside the calling loop's own future. A delivery already
/// available wins over a stop that races it only if the stop was not yet
/// visible: checked first, so a stopped loop never takes another delivery.
/// `$stopped` is the loop's own `stop.wait()`, pinned once: it registers on
/// the first wait and stays registered, so a wait costs no registration of
/// its own. After `None` the loop ends (a finished `$stopped` must not be
/// polled again).
macro_rules! next {
    ($subscription:expr, $stop:expr, $stopped:expr) => {{
        let stop: &$crate::exec::stop::Stop = $stop;
        if stop.is_stopped() {
            None
        } else if let Some(delivery) = $crate::exec::sequential::at_hand($subscription).await {
            Some(delivery)
        } else {
            $crate::exec::sequential::wait_next($subscription, $stopped).await
        }
    }};
}
pub(crate) use next;

/// The delivery the binding has at hand, if any, without waiting
/// ([`Subscription::try_next`]), within the task's cooperative budget: a
/// loop with a backlog still lets the other tasks of its runtime run.
#[inline]
pub(crate) fn at_hand<S: Subscription>(
    subscription: &mut S,
) -> impl Future<Output = Option<S::Delivery>> + '_ {
    poll_fn(|cx| {
        let budget = ready!(tokio::task::coop::poll_proceed(cx));
        let delivery = subscription.try_next();
        if delivery.is_some() {
            budget.made_progress();
        }
        Poll::Ready(delivery)
    })
}

/// Runs until `stop` or the end of the subscription. A delivery taken before
/// `stop` is processed and settled before the loop returns.
pub(crate) async fn run<B: Broker, S: SendSubscriber>(
    unit: Unit<B, S>,
    mut subscription: B::Subscription,
    stop: Stop,
) {
    // `next` and `Unit::process`, spelled out so each delivery is taken and
    // runs inside this loop's own future rather than in futures moved into it.
    let jobs = Arc::clone(unit.app.jobs());
    // One stop waiter for the whole loop: registered once, not per wait.
    let mut stopped = pin!(stop.wait());
    loop {
        // JQ-4 step 1; the wait (with its stop race) only when none is free.
        let Some(permit) = super::take_permit!(&jobs, &stop) else {
            break;
        };
        let Some(delivery) = next!(&mut subscription, &stop, stopped.as_mut()) else {
            break;
        };
        match unit.check(&delivery) {
            Checked::Body(body) => {
                // JQ-4 step 5: the permit returns right before the handler.
                drop(permit);
                invoke!(&unit, delivery, handle_send(body));
            }
            Checked::Early(early) => {
                Box::pin(unit.settle_early(delivery, early)).await;
                drop(permit);
            }
        }
    }
}

/// [`next!`] after [`at_hand`] found nothing: [`Subscription::next`] unless
/// `stopped` comes first. By hand rather than `select!`: the subscription
/// first, and the stop signal only while the subscription is pending.
pub(crate) async fn wait_next<S: Subscription>(
    subscription: &mut S,
    mut stopped: Pin<&mut impl Future<Output = ()>>,
) -> Option<S::Delivery> {
    let mut delivery = pin!(Subscription::next(subscription));
    poll_fn(|cx| {
        if let Poll::Ready(delivery) = delivery.as_mut().poll(cx) {
            return Poll::Ready(delivery);
        }
        stopped.as_mut().poll(cx).map(|()| None)
    })
    .await
}
