//! The default loop (RT-2): one task per subscriber polls the next delivery
//! only after the previous one is settled, so at most one delivery is in
//! flight and backpressure is simply not polling.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;

use super::budget::Budget;
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
/// polled again). `$budget` is the loop's [`Budget`]:
/// a loop with a backlog yields to the other tasks of its runtime every so
/// many deliveries.
macro_rules! next {
    ($subscription:expr, $stop:expr, $stopped:expr, $budget:expr) => {{
        let stop: &$crate::exec::stop::Stop = $stop;
        let budget: &mut $crate::exec::budget::Budget = $budget;
        if budget.spend() {
            ::tokio::task::yield_now().await;
        }
        if stop.is_stopped() {
            None
        } else if let Some(delivery) = $crate::binding::Subscription::try_next($subscription) {
            Some(delivery)
        } else {
            budget.refill();
            $crate::exec::sequential::wait_next($subscription, $stopped).await
        }
    }};
}
pub(crate) use next;

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
    let mut budget = Budget::new();
    loop {
        // JQ-4 step 1. The permit borrows `jobs`, which this loop keeps alive.
        let Some(permit) =
            super::take_permit!(jobs.try_acquire_borrowed(), jobs.acquire_borrowed(), &stop)
        else {
            break;
        };
        let Some(delivery) = next!(&mut subscription, &stop, stopped.as_mut(), &mut budget) else {
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

/// [`next!`] after `Subscription::try_next` found nothing: [`Subscription::next`] unless
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
