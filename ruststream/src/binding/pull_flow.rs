//! The receive-flow switch of a binding that pulls (JetStream pulls, Redis
//! `XREADGROUP`, RabbitMQ's consumer): while paused, no new read is issued;
//! what was already read is still handed out.

use tokio::sync::watch;

use crate::ingress::ReceiveFlow;

/// The receive-flow switch of a pull subscription: while paused, no
/// new pull is made.
pub(crate) struct PullFlow {
    paused: watch::Sender<bool>,
}

impl Default for PullFlow {
    fn default() -> Self {
        PullFlow {
            paused: watch::Sender::new(false),
        }
    }
}

impl PullFlow {
    /// Whether the flow is paused now.
    #[cfg(feature = "mqtt")]
    pub(crate) fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Resolves while (or once) the flow is running.
    pub(crate) async fn running(&self) {
        // The sender lives as long as `self`, so the wait cannot fail.
        let _ = self.paused.subscribe().wait_for(|paused| !paused).await;
    }
}

impl ReceiveFlow for PullFlow {
    fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
    }
}
