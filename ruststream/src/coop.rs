//! The cooperative budget of publishes: a task that only publishes (and
//! never has to wait) still lets the other tasks of its runtime run. Below
//! the bindings, so a transport needs nothing of the execution modes.

use std::cell::Cell;
use std::task::{Context, Poll};

/// Publishes on one thread per unit of tokio's budget a publish spends.
const PUBLISHES_PER_UNIT: u32 = 16;

thread_local! {
    static PUBLISHES: Cell<u32> = const { Cell::new(0) };
}

/// The cooperative budget of a publish that never has to wait (it has no
/// loop to keep a budget in): every [`PUBLISHES_PER_UNIT`]th publish on
/// a thread spends one unit of its task's tokio budget, and yields when
/// that is spent. Tokio's own per-task accounting keeps each task fair to
/// the others; sampling it keeps its thread-local round trip off most
/// publishes. A task that only publishes yields every 2,048 publishes.
#[inline]
pub(crate) fn poll_publish(cx: &mut Context<'_>) -> Poll<()> {
    let sampled = PUBLISHES
        .try_with(|count| {
            let n = count.get().wrapping_add(1);
            count.set(n);
            n % PUBLISHES_PER_UNIT == 0
        })
        .unwrap_or(true);
    if !sampled {
        return Poll::Ready(());
    }
    tokio::task::coop::poll_proceed(cx).map(|restore| restore.made_progress())
}

/// `f`, run where tokio's per-task budget is not spent: for a step that
/// takes what a client already holds, which the runtime's own budget
/// ([`crate::exec::budget`]) bounds instead.
/// (Only the bindings whose clients buffer deliveries take such steps.)
#[cfg(any(feature = "nats", feature = "redis"))]
pub(crate) fn unconstrained<R>(f: impl FnOnce() -> R) -> R {
    use std::future::Future;

    let mut f = Some(f);
    let step = tokio::task::coop::unconstrained(std::future::poll_fn(|_| {
        Poll::Ready(f.take().map(|f| f()))
    }));
    match std::pin::pin!(step).poll(&mut Context::from_waker(std::task::Waker::noop())) {
        Poll::Ready(Some(output)) => output,
        _ => unreachable!("a ready step runs once"),
    }
}
