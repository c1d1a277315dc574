//! [`MemoryBrokerBuilder`]: the settings of a new memory broker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::inbox::Inbox;
use super::registry::Registry;
use super::shared::BrokerShared;
use super::{Connection, Inner, MemoryBroker, NEXT_BROKER_ID, ReceiveRound};
use crate::Text;
use crate::config::CoreHwm;

/// Settings for a [`MemoryBroker`].
///
/// ```
/// use std::time::Duration;
/// use ruststream::MemoryBroker;
/// use ruststream::binding::memory::{CoreHwm, CoreHwmProfile};
///
/// let broker = MemoryBroker::builder()
///     .hwm(CoreHwm::profile(CoreHwmProfile::Small).budget_bytes(256 * 1024))
///     .publish_timeout(Duration::from_secs(2))
///     .max_publish_waiters(128)
///     .build();
/// # drop(broker);
/// ```
#[derive(Clone, Debug)]
pub struct MemoryBrokerBuilder {
    hwm: CoreHwm,
    round: ReceiveRound,
    publish_timeout: Duration,
    max_publish_waiters: usize,
}

impl Default for MemoryBrokerBuilder {
    fn default() -> Self {
        MemoryBrokerBuilder {
            hwm: CoreHwm::default(),
            round: ReceiveRound::default(),
            publish_timeout: Duration::from_secs(10),
            max_publish_waiters: 1024,
        }
    }
}

impl MemoryBrokerBuilder {
    /// Core HWM settings (default: `CoreHwmProfile::Balanced`).
    pub fn hwm(mut self, hwm: CoreHwm) -> Self {
        self.hwm = hwm;
        self
    }

    /// Byte and time budgets of one fair receive round (default 1 MiB
    /// or 5 ms, whichever ends first, with at most 64 frames). A queue fed by
    /// several connections takes a round from one, then moves on to the next.
    pub fn receive_round(mut self, round: ReceiveRound) -> Self {
        self.round = round;
        self
    }

    /// Deadline of a publish that passes none (default 10 s).
    pub fn publish_timeout(mut self, timeout: Duration) -> Self {
        self.publish_timeout = timeout;
        self
    }

    /// How many publishes may wait for queue space at once (default 1024);
    /// one more fails at once with `DeadlineExceeded`.
    pub fn max_publish_waiters(mut self, n: usize) -> Self {
        self.max_publish_waiters = n;
        self
    }

    /// The broker.
    pub fn build(self) -> MemoryBroker {
        let id = NEXT_BROKER_ID.fetch_add(1, Ordering::Relaxed);
        MemoryBroker {
            inner: Arc::new(Inner {
                id,
                generation: AtomicU64::new(0),
                shared: Arc::new(BrokerShared::new(
                    self.hwm.effective_memory_limit_bytes(),
                    self.max_publish_waiters,
                )),
                registry: RwLock::new(Registry::default()),
                budget: self.hwm.effective_budget_bytes(),
                round: self.round,
                publish_timeout: self.publish_timeout,
                inbox: Inbox::new(Text::from(format!("_INBOX.{id}."))),
                reply_lanes: Mutex::new(HashMap::new()),
                next_queue: AtomicU64::new(1),
            }),
            conn: Connection::open(),
        }
    }
}
