//! The subscription of a `workers(n)` or `threads(n)` subscriber, shared
//! by everyone who takes deliveries from it: the delivery at hand is
//! claimed in place under its lock ([`Shared::with`]); to wait for one, a
//! taker takes the subscription out ([`Shared::take`]) and the others wait
//! for it back (or, on dedicated threads, for the feeder's hand-off).

use std::future::{Future, poll_fn};
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::sync::{Mutex, MutexGuard};
use crate::waiters::Waiters;

/// Why the subscription is not at hand.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Out {
    /// A worker has it out, waiting with it.
    Taken,
    /// Closed: workers take nothing more.
    Closed,
}

/// The subscription the workers share.
pub(crate) struct Shared<T> {
    state: Mutex<Slot<T>>,
}

struct Slot<T> {
    /// `None` while a worker has it out.
    subscription: Option<T>,
    /// Workers waiting for it back, oldest first.
    waiting: Waiters,
    closed: bool,
}

impl<T> Shared<T> {
    pub(crate) fn new(subscription: T) -> Self {
        Shared {
            state: Mutex::new(Slot {
                subscription: Some(subscription),
                waiting: Waiters::default(),
                closed: false,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot<T>> {
        self.state.lock()
    }

    /// `f` on the subscription, in place, if it is at hand.
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> Result<R, Out> {
        let mut slot = self.lock();
        if slot.closed {
            return Err(Out::Closed);
        }
        match slot.subscription.as_mut() {
            Some(subscription) => Ok(f(subscription)),
            None => Err(Out::Taken),
        }
    }

    /// Takes the subscription out, waiting while another worker has it;
    /// `None` once closed or `stopped`. Given back when the [`Held`] drops.
    pub(crate) async fn take(
        &self,
        mut stopped: Pin<&mut impl Future<Output = ()>>,
    ) -> Option<Held<'_, T>> {
        let mut wait = Wait {
            shared: self,
            token: None,
        };
        poll_fn(|cx| match wait.poll(cx) {
            Poll::Ready(held) => Poll::Ready(held),
            Poll::Pending => stopped.as_mut().poll(cx).map(|()| None),
        })
        .await
    }

    /// [`close`](Self::close)s, and takes the subscription out to drop
    /// where its owner chooses; `None` while someone has it out.
    pub(crate) fn take_closed(&self) -> Option<T> {
        self.close();
        self.lock().subscription.take()
    }

    /// Workers take nothing more; the waiting ones are woken to see it.
    pub(crate) fn close(&self) {
        let mut slot = self.lock();
        slot.closed = true;
        let waiting = slot.waiting.take_all();
        drop(slot);
        for waker in waiting {
            waker.wake();
        }
    }
}

/// One worker's wait for the subscription. Dropped after it was woken
/// for a subscription it never took (its wait ended by `stop`), it hands
/// the wake-up on, so the subscription does not sit while others wait.
struct Wait<'a, T> {
    shared: &'a Shared<T>,
    /// Set while listed as waiting.
    token: Option<u64>,
}

impl<'a, T> Wait<'a, T> {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Held<'a, T>>> {
        let mut guard = self.shared.lock();
        let slot = &mut *guard;
        if slot.closed {
            slot.waiting.forget(self.token.take());
            return Poll::Ready(None);
        }
        if let Some(subscription) = slot.subscription.take() {
            slot.waiting.forget(self.token.take());
            return Poll::Ready(Some(Held {
                shared: self.shared,
                subscription: Some(subscription),
            }));
        }
        // New, refreshed, or again after a wake-up for a subscription
        // another worker took first.
        slot.waiting.register(&mut self.token, cx.waker());
        Poll::Pending
    }
}

impl<T> Drop for Wait<'_, T> {
    fn drop(&mut self) {
        if self.token.is_none() {
            return;
        }
        let mut slot = self.shared.lock();
        if slot.waiting.forget(self.token) || slot.subscription.is_none() {
            return;
        }
        // Woken for a subscription it will not take: the next one may.
        let next = slot.waiting.take_one();
        drop(slot);
        if let Some(next) = next {
            next.wake();
        }
    }
}

/// The subscription, taken out by one worker; given back on drop, with a
/// wake-up for the oldest waiting worker.
pub(crate) struct Held<'a, T> {
    shared: &'a Shared<T>,
    subscription: Option<T>,
}

impl<T> Deref for Held<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.subscription.as_ref().expect("held until dropped")
    }
}

impl<T> DerefMut for Held<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.subscription.as_mut().expect("held until dropped")
    }
}

impl<T> Drop for Held<'_, T> {
    fn drop(&mut self) {
        let mut slot = self.shared.lock();
        slot.subscription = self.subscription.take();
        let next = slot.waiting.take_one();
        drop(slot);
        if let Some(next) = next {
            next.wake();
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::{Out, Shared};

    #[test]
    fn a_worker_waiting_for_the_subscription_gets_it_when_given_back() {
        let shared = Shared::new(vec![1, 2]);
        let mut cx = Context::from_waker(Waker::noop());
        let (mut never, mut never_2, mut never_3) = (
            pin!(std::future::pending::<()>()),
            pin!(std::future::pending::<()>()),
            pin!(std::future::pending::<()>()),
        );
        let Poll::Ready(Some(mut held)) = pin!(shared.take(never.as_mut())).poll(&mut cx) else {
            panic!("at hand");
        };
        assert_eq!(shared.with(|v| v.len()), Err(Out::Taken));
        let mut second = pin!(shared.take(never_2.as_mut()));
        assert!(second.as_mut().poll(&mut cx).is_pending(), "another has it");
        held.push(3);
        drop(held);
        let Poll::Ready(Some(held)) = second.as_mut().poll(&mut cx) else {
            panic!("given back");
        };
        assert_eq!(*held, [1, 2, 3]);
        drop(held);
        assert_eq!(shared.with(|v| v.len()), Ok(3));
        shared.close();
        assert_eq!(shared.with(|v| v.len()), Err(Out::Closed));
        assert!(matches!(
            pin!(shared.take(never_3.as_mut())).poll(&mut cx),
            Poll::Ready(None)
        ));
    }

    #[test]
    fn a_wait_ended_by_stop_after_its_wake_up_hands_the_wake_up_on() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::task::Wake;

        struct Count(AtomicUsize);
        impl Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let shared = Shared::new(());
        let mut cx = Context::from_waker(Waker::noop());
        let (mut never, mut never_2, mut never_3) = (
            pin!(std::future::pending::<()>()),
            pin!(std::future::pending::<()>()),
            pin!(std::future::pending::<()>()),
        );
        let Poll::Ready(Some(held)) = pin!(shared.take(never.as_mut())).poll(&mut cx) else {
            panic!("at hand");
        };
        // Two wait; the give-back wakes the first, which then ends without
        // taking it (as when its stop comes first).
        let first = Arc::new(Count(AtomicUsize::new(0)));
        let second = Arc::new(Count(AtomicUsize::new(0)));
        let mut wait = Box::pin(shared.take(never_3.as_mut()));
        let waker = Waker::from(Arc::clone(&first));
        assert!(
            wait.as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        let mut other = pin!(shared.take(never_2.as_mut()));
        let waker = Waker::from(Arc::clone(&second));
        assert!(
            other
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending()
        );
        drop(held);
        assert_eq!(first.0.load(Ordering::SeqCst), 1, "the oldest is woken");
        assert_eq!(second.0.load(Ordering::SeqCst), 0);
        drop(wait);
        assert_eq!(second.0.load(Ordering::SeqCst), 1, "the wake-up passed on");
    }
}
