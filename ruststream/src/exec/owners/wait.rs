//! A worker's wait for its next turn, and the producers' wait for room.

use std::task::{Context, Poll, Waker};

use super::{OwnerSet, Turn};

/// One worker waiting for a turn. Dropped while it waits (its task aborted),
/// it leaves the sleepers and hands a wake-up it may have received on to
/// another worker, so no ready owner is stranded.
pub(crate) struct Sleep<'a, T, P> {
    pub(super) set: &'a OwnerSet<T, P>,
    /// Set while this wait is pending (it registered as a sleeper).
    pub(super) token: Option<u64>,
}

impl<T, P> Sleep<'_, T, P> {
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Turn<T, P>>> {
        let mut guard = self.set.lock();
        let state = &mut *guard;
        // Level-triggered: whatever woke us (or not), re-check the set.
        if let Some(turn) = state.take_ready() {
            if let Some(token) = self.token.take() {
                // Polled without being woken: leave the sleepers.
                state.sleepers.retain(|(t, _)| *t != token);
            }
            // Hand the remaining work to another sleeping worker.
            let other = if state.ready.is_empty() {
                None
            } else {
                state.wake_one()
            };
            drop(guard);
            if let Some(other) = other {
                other.wake();
            }
            return Poll::Ready(Some(turn));
        }
        if state.closed && state.total == 0 {
            if let Some(token) = self.token.take() {
                state.sleepers.retain(|(t, _)| *t != token);
            }
            return Poll::Ready(None);
        }
        match self.token {
            Some(token) => match state.sleepers.iter_mut().find(|(t, _)| *t == token) {
                Some((_, waker)) => {
                    if !waker.will_wake(cx.waker()) {
                        *waker = cx.waker().clone();
                    }
                }
                // Woken, but nothing is left: sleep again.
                None => state.sleepers.push((token, cx.waker().clone())),
            },
            None => {
                let token = state.next_token;
                state.next_token += 1;
                self.token = Some(token);
                state.sleepers.push((token, cx.waker().clone()));
            }
        }
        Poll::Pending
    }
}

impl<T, P> Drop for Sleep<'_, T, P> {
    fn drop(&mut self) {
        let Some(token) = self.token else {
            return;
        };
        let mut state = self.set.lock();
        let before = state.sleepers.len();
        state.sleepers.retain(|(t, _)| *t != token);
        // No longer listed: this wait was woken and will never re-check the
        // set, so another sleeper does.
        let other = if state.sleepers.len() == before && !state.ready.is_empty() {
            state.wake_one()
        } else {
            None
        };
        drop(state);
        if let Some(other) = other {
            other.wake();
        }
    }
}

/// Adds the current task to the capacity waiters unless it is there.
pub(super) fn register_space(space: &mut Vec<Waker>, cx: &Context<'_>) {
    if !space.iter().any(|w| w.will_wake(cx.waker())) {
        space.push(cx.waker().clone());
    }
}
