//! The receive-flow switch of a binding that pulls (JetStream pulls, Redis
//! `XREADGROUP`): while paused, no new read is issued (JQ-15); what was
//! already read is still handed out.

use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

use crate::ingress::ReceiveFlow;

/// The receive-flow switch of a pull subscription (JQ-15): while paused, no
/// new pull is made.
#[derive(Default)]
pub(crate) struct PullFlow {
    paused: AtomicBool,
    resumed: Notify,
}

impl PullFlow {
    /// Resolves while (or once) the flow is running.
    pub(crate) async fn running(&self) {
        loop {
            let mut resumed = pin!(self.resumed.notified());
            resumed.as_mut().enable();
            if !self.paused.load(Ordering::Acquire) {
                return;
            }
            resumed.await;
        }
    }
}

impl ReceiveFlow for PullFlow {
    fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Release);
        if !paused {
            self.resumed.notify_waiters();
        }
    }
}
