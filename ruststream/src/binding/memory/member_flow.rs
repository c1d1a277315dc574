//! A queue member's receive-flow switch: what the job queue's pressure
//! state sets on a request/reply source of the memory broker.

use std::sync::Arc;

use parking_lot::Mutex;

use super::queue::Queue;

/// A member's receive-flow switch on the memory Core: the job queue
/// sets it; the subscription retires it when it closes, after which late
/// transitions are ignored.
pub(crate) struct MemberFlow {
    queue: Arc<Queue>,
    /// (paused, retired)
    state: Mutex<(bool, bool)>,
}

impl MemberFlow {
    /// The switch of a member that joined `paused` or not.
    pub(crate) fn new(queue: Arc<Queue>, paused: bool) -> Self {
        MemberFlow {
            queue,
            state: Mutex::new((paused, false)),
        }
    }

    /// The member leaves: lifts its pause for good.
    pub(crate) fn retire(&self) {
        let mut state = self.state.lock();
        let was_paused = state.0;
        *state = (false, true);
        if was_paused {
            self.queue.set_member_paused(false);
        }
    }
}

impl crate::ingress::ReceiveFlow for MemberFlow {
    fn set_paused(&self, paused: bool) {
        let mut state = self.state.lock();
        if state.1 || state.0 == paused {
            return;
        }
        state.0 = paused;
        // Under this member's own lock, so two transitions never apply out of
        // order; the queue lock is taken inside it, never the other way.
        self.queue.set_member_paused(paused);
    }
}
