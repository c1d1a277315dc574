//! Tasks waiting for something kept under a lock, listed under that same
//! lock: a task finds what it waits for missing and registers in one lock,
//! and whoever makes it available takes the oldest waiter in the lock it
//! already holds. No separate notification, so no lost wake-up between the
//! look and the registration, and nothing to pay while nobody waits. The
//! memory Core's consumers wait on their receive queue this way, and
//! `workers(n)`'s idle workers for the subscription they share.

use std::collections::VecDeque;
use std::task::Waker;

#[derive(Default)]
pub(crate) struct Waiters {
    next_token: u64,
    /// Oldest first; a token appears at most once.
    waiting: VecDeque<(u64, Waker)>,
}

impl Waiters {
    /// Registers (or refreshes) the waiter `token`, assigning one if it has
    /// none yet.
    pub(crate) fn register(&mut self, token: &mut Option<u64>, waker: &Waker) {
        let id = *token.get_or_insert_with(|| {
            self.next_token += 1;
            self.next_token
        });
        match self.waiting.iter_mut().find(|(t, _)| *t == id) {
            Some((_, old)) if old.will_wake(waker) => {}
            Some((_, old)) => old.clone_from(waker),
            None => self.waiting.push_back((id, waker.clone())),
        }
    }

    /// Removes `token` if it still waits; `false` when it was already taken
    /// (woken) or never registered.
    pub(crate) fn forget(&mut self, token: Option<u64>) -> bool {
        let Some(id) = token else {
            return false;
        };
        match self.waiting.iter().position(|(t, _)| *t == id) {
            Some(at) => {
                self.waiting.remove(at);
                true
            }
            None => false,
        }
    }

    /// The oldest waiter, to wake (outside the lock) for one new item.
    #[inline]
    pub(crate) fn take_one(&mut self) -> Option<Waker> {
        if self.waiting.is_empty() {
            return None;
        }
        self.waiting.pop_front().map(|(_, waker)| waker)
    }

    /// Every waiter, to wake (outside the lock) so each looks again.
    pub(crate) fn take_all(&mut self) -> Vec<Waker> {
        self.waiting.drain(..).map(|(_, waker)| waker).collect()
    }
}
