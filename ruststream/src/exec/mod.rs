//! Execution modes: how a subscriber's deliveries are scheduled.
//!
//! | mode | where handlers run | in flight | read-ahead beyond the broker's queue |
//! |---|---|---|---|
//! | sequential | the loop task | 1 | none |
//! | `batch(max, wait)` | the loop task | `max`, in one call | none: one permit per record |
//! | `workers(n)` | `n` tasks on the app runtime | `n` | none: an idle worker takes its next delivery itself |
//! | `workers(n, by_key)` | `n` tasks, one key at a time each | `n` | `max_pending` deliveries in owner FIFOs |
//! | `threads(n)` | `n` OS threads, own runtimes | `n` | ≤ 8 per thread, claimed by a busy thread or pushed to an idle one (`n × 9` with the ones in hand) |

pub(crate) mod batch;
pub(crate) mod budget;
pub(crate) mod by_key;
mod feed;
pub(crate) mod owners;
pub(crate) mod ring;
pub(crate) mod ring_wait;
pub(crate) mod rings;
pub(crate) mod sequential;
pub(crate) mod shared_subscription;
pub(crate) mod snooze_backoff;
pub(crate) mod threads;
pub(crate) mod workers;

use std::future::poll_fn;
use std::pin::{Pin, pin};
use std::task::Poll;

use crate::host::Stop;

use crate::binding::Subscription;

/// the next delivery together with the job permit taken before it
/// was claimed, as `Option<(delivery, permit)>`: `None` once `$stop` was
/// called or the subscription ended. Every loop takes its deliveries
/// through this one step (`workers(n)` claims the delivery at hand in place
/// first, and takes this step with the subscription when it must wait):
///
/// * a free permit is taken inline (`$try`, lock-free) and the delivery at
///   hand claimed without waiting (`Subscription::try_next`): the path of a
///   loop with a backlog, with no future built;
/// * with nothing at hand the permit goes back at once, and the loop waits
///   for [`Subscription::ready`] holding nothing: an idle subscription never
///   sits on a permit another one needs;
/// * with no permit free, the loop first waits until its subscription is
///   ready and only then joins the permit queue (`$wait`, oldest waiter
///   first), so the queue holds only sources with work;
/// * a loop that took the last free permit yields before its next take
///   (`$jobs` tells), so sources sharing few permits take turns even on one
///   worker thread, where a waiting loop could otherwise not run until this
///   one's budget ran out.
///
/// `$stopped` is the loop's own `stop.wait()`, pinned once (it registers on
/// the first wait and stays registered); after `None` the loop ends. Every
/// so many deliveries in a row ([`Budget`](budget::Budget)) the loop lets
/// the other tasks of its runtime run. The optional `$before_wait` runs before every
/// wait and yield (the threads feeder wakes the threads it owes a wake-up).
///
/// Spelled `receive!(let (delivery, permit) = $subscription, .., else:
/// $none, again: $again)` it binds the pair itself, in the caller's scope:
/// the delivery is moved from the subscription into the caller's binding
/// once, not through a value of a loop (an `Option` or a tuple) first.
/// `$none` is a `break` or `return` out of the caller's loop (where `None`
/// would end it); `$again` a `continue` of it, taken after an empty look
/// and a wait, so the step must open the caller's loop body, after nothing
/// but what may run again.
macro_rules! receive {
    (@take $delivery:pat, $permit:ident, $subscription:expr, $jobs:expr, $try:expr, $wait:expr, $stop:expr, $stopped:expr, $budget:expr, before_wait: $($before_wait:expr)?, none: $none:expr, again: $again:expr) => {
        // `$stop` and `$budget` are used where needed, not bound: a
        // binding would be one more slot of the caller's future to fill.
        if $crate::exec::budget::Budget::spend($budget) {
            $($before_wait;)?
            ::tokio::task::yield_now().await;
        }
        let $permit = match $try {
            Some(permit) => permit,
            None => {
                $($before_wait;)?
                $crate::exec::budget::Budget::refill($budget);
                if !$crate::exec::wait_ready($subscription, $stopped).await {
                    $none;
                }
                match $crate::exec::wait_permit($wait, $stop).await {
                    Some(permit) => permit,
                    None => $none,
                }
            }
        };
        if $jobs.saturated() {
            $crate::exec::budget::Budget::end_batch($budget);
        }
        // A stopped loop takes no further delivery, even one at hand.
        if $crate::host::Stop::is_stopped($stop) {
            $none;
        }
        // Bound where it is claimed: a value of a loop (an `Option` or a
        // tuple) would be one more copy of the delivery.
        let Some($delivery) = $crate::binding::Subscription::try_next($subscription) else {
            drop($permit);
            $($before_wait;)?
            $crate::exec::budget::Budget::refill($budget);
            if !$crate::exec::wait_ready($subscription, $stopped).await {
                $none;
            }
            $again;
        };
    };
    (let ($delivery:pat, $permit:ident) = $subscription:expr, $jobs:expr, $try:expr, $wait:expr, $stop:expr, $stopped:expr, $budget:expr, $($before_wait:expr,)? else: $none:expr, again: $again:expr $(,)?) => {
        $crate::exec::receive!(@take $delivery, $permit, $subscription, $jobs, $try, $wait, $stop, $stopped, $budget, before_wait: $($before_wait)?, none: $none, again: $again)
    };
    ($subscription:expr, $jobs:expr, $try:expr, $wait:expr, $stop:expr, $stopped:expr, $budget:expr $(, $before_wait:expr)? $(,)?) => {
        'receive: loop {
            $crate::exec::receive!(@take delivery, permit, $subscription, $jobs, $try, $wait, $stop, $stopped, $budget, before_wait: $($before_wait)?, none: break 'receive ::core::option::Option::None, again: continue 'receive);
            break 'receive ::core::option::Option::Some((delivery, permit));
        }
    };
}
pub(crate) use receive;

/// Waits for a permit (`wait`: the oldest waiting source is served first),
/// unless `stop` comes first; a cancelled wait takes nothing.
pub(crate) async fn wait_permit<P>(wait: impl Future<Output = P>, stop: &Stop) -> Option<P> {
    tokio::select! {
        biased;
        permit = wait => Some(permit),
        () = stop.wait() => None,
    }
}

/// [`Subscription::ready`] unless `stopped` comes first (`false` then, as
/// at the end of the subscription). By hand rather than `select!`: the
/// subscription first, the stop signal only while it is pending.
pub(crate) async fn wait_ready<S: Subscription>(
    subscription: &mut S,
    mut stopped: Pin<&mut impl Future<Output = ()>>,
) -> bool {
    let mut ready = pin!(subscription.ready());
    poll_fn(|cx| {
        if let Poll::Ready(ready) = ready.as_mut().poll(cx) {
            return Poll::Ready(ready);
        }
        stopped.as_mut().poll(cx).map(|()| false)
    })
    .await
}

/// Maps a key hash onto `0..n` using its high bits.
pub(crate) fn slot(hash: u64, n: usize) -> usize {
    ((u128::from(hash) * n as u128) >> 64) as usize
}
