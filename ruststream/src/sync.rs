//! The locks, atomics and semaphore of the runtime's concurrent hand-offs
//! (the job queue's permits, the owner FIFOs, the subscription the workers share, the
//! threads' rings). Built with `--cfg loom`, they are loom's, so the models
//! in `loom_models` explore every interleaving of the real code.

// Not poisoning: no user code runs under these locks, so a panic leaves
// their state consistent, and a lock without the poison checks costs about
// half as many instructions (a by-key delivery takes three of them). The
// memory Core's locks, which no model explores, use `parking_lot` directly
// for the same reason.
#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic;
#[cfg(not(loom))]
pub(crate) use tokio::sync::Semaphore;

#[cfg(loom)]
pub(crate) use loom::sync::{MutexGuard, atomic};
#[cfg(loom)]
pub(crate) use loom_semaphore::Semaphore;

/// Loom's mutex with the lock call of the one used outside loom.
#[cfg(loom)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
        self.0.lock().unwrap()
    }
}

/// Tokio's semaphore is not built on loom's primitives, so under loom the
/// job queue's slow path waits on this one: FIFO like tokio's (a release
/// goes to the oldest waiter first), with the part of its API the job
/// queue uses.
#[cfg(loom)]
mod loom_semaphore {
    use std::collections::VecDeque;
    use std::future::poll_fn;
    use std::task::{Poll, Waker};

    use super::Mutex;

    pub(crate) struct Semaphore {
        state: Mutex<State>,
    }

    struct State {
        permits: usize,
        /// Waiters, oldest first: (ticket, waker, granted).
        waiters: VecDeque<(u64, Option<Waker>, bool)>,
        next_ticket: u64,
    }

    /// A permit; the job queue always forgets it (it keeps its own count).
    pub(crate) struct Permit;

    impl Permit {
        pub(crate) fn forget(self) {}
    }

    impl Semaphore {
        pub(crate) fn new(permits: usize) -> Self {
            Semaphore {
                state: Mutex::new(State {
                    permits,
                    waiters: VecDeque::new(),
                    next_ticket: 0,
                }),
            }
        }

        pub(crate) fn available_permits(&self) -> usize {
            self.state.lock().permits
        }

        pub(crate) fn try_acquire(&self) -> Result<Permit, ()> {
            let mut state = self.state.lock();
            if state.permits == 0 {
                return Err(());
            }
            state.permits -= 1;
            Ok(Permit)
        }

        pub(crate) fn add_permits(&self, n: usize) {
            let mut wake = Vec::new();
            let mut state = self.state.lock();
            let mut left = n;
            for (_, waker, granted) in state.waiters.iter_mut() {
                if left == 0 {
                    break;
                }
                if !*granted {
                    *granted = true;
                    left -= 1;
                    wake.extend(waker.take());
                }
            }
            state.permits += left;
            drop(state);
            wake.into_iter().for_each(Waker::wake);
        }

        pub(crate) async fn acquire(&self) -> Result<Permit, ()> {
            let mut ticket = None;
            let mut waiting = Waiting {
                semaphore: self,
                ticket: None,
            };
            poll_fn(|cx| {
                let mut state = self.state.lock();
                match ticket {
                    None if state.permits > 0 && state.waiters.is_empty() => {
                        state.permits -= 1;
                        Poll::Ready(Ok(Permit))
                    }
                    None => {
                        let t = state.next_ticket;
                        state.next_ticket += 1;
                        state
                            .waiters
                            .push_back((t, Some(cx.waker().clone()), false));
                        ticket = Some(t);
                        waiting.ticket = Some(t);
                        Poll::Pending
                    }
                    Some(t) => {
                        let at = state.waiters.iter().position(|w| w.0 == t).unwrap();
                        if state.waiters[at].2 {
                            state.waiters.remove(at);
                            waiting.ticket = None;
                            Poll::Ready(Ok(Permit))
                        } else {
                            state.waiters[at].1 = Some(cx.waker().clone());
                            Poll::Pending
                        }
                    }
                }
            })
            .await
        }
    }

    /// Leaves the queue when a wait is dropped; a permit already granted
    /// to it goes on to the next waiter.
    struct Waiting<'a> {
        semaphore: &'a Semaphore,
        ticket: Option<u64>,
    }

    impl Drop for Waiting<'_> {
        fn drop(&mut self) {
            let Some(t) = self.ticket else { return };
            let mut state = self.semaphore.state.lock();
            let at = state.waiters.iter().position(|w| w.0 == t).unwrap();
            let (_, _, granted) = state.waiters.remove(at).unwrap();
            drop(state);
            if granted {
                self.semaphore.add_permits(1);
            }
        }
    }
}
