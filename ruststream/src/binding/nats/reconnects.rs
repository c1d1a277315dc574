//! The times a connection came back after it was lost. A JetStream pull
//! made before cannot be trusted: the server dropped it with the old
//! connection, and waiting for it to expire would stall the subscription.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_nats::Event;
use tokio::sync::watch;

/// Counts reconnections; cloned into the client's event callback.
#[derive(Clone)]
pub(super) struct Reconnects {
    count: Arc<watch::Sender<u64>>,
    lost: Arc<AtomicBool>,
}

impl Default for Reconnects {
    fn default() -> Self {
        Reconnects {
            count: Arc::new(watch::channel(0).0),
            lost: Arc::new(AtomicBool::new(false)),
        }
    }
}

impl Reconnects {
    /// Called with every client event; the first connection does not count.
    pub(super) fn observe(&self, event: &Event) {
        match event {
            Event::Disconnected => self.lost.store(true, Ordering::Release),
            Event::Connected if self.lost.swap(false, Ordering::AcqRel) => {
                self.count.send_modify(|n| *n += 1);
            }
            _ => {}
        }
    }

    /// A receiver whose `changed()` resolves at the next reconnection.
    pub(super) fn watch(&self) -> watch::Receiver<u64> {
        self.count.subscribe()
    }
}
