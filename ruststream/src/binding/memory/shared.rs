//! Broker-wide accounting of the memory Core: `CoreHwmMemoryLimitBytes` and the
//! bounded set of publish waiters.

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

pub(crate) struct BrokerShared {
    /// Bytes owned by all receive queues of the broker.
    bytes: AtomicUsize,
    memory_limit: usize,
    /// Publishers waiting for space sleep here; woken when bytes are released.
    pub(crate) space: Notify,
    waiters: AtomicUsize,
    max_waiters: usize,
}

/// A taken waiter slot; returned on drop (also on cancellation).
pub(crate) struct WaiterSlot<'a>(&'a BrokerShared);

impl Drop for WaiterSlot<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

impl BrokerShared {
    pub(crate) fn new(memory_limit: usize, max_waiters: usize) -> Self {
        BrokerShared {
            bytes: AtomicUsize::new(0),
            memory_limit,
            space: Notify::new(),
            waiters: AtomicUsize::new(0),
            max_waiters,
        }
    }

    /// Charges `len` bytes if the broker-wide limit allows (an empty broker
    /// always admits one frame).
    pub(crate) fn charge(&self, len: usize) -> bool {
        let mut current = self.bytes.load(Ordering::Relaxed);
        loop {
            if current > 0 && current + len > self.memory_limit {
                return false;
            }
            match self.bytes.compare_exchange_weak(
                current,
                current + len,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => current = now,
            }
        }
    }

    pub(crate) fn charge_unchecked(&self, len: usize) {
        self.bytes.fetch_add(len, Ordering::AcqRel);
    }

    /// Releases bytes, and wakes the publishers waiting for space (if any)
    /// when the lane the bytes left holds half its budget or less
    /// (`lane_drained`). A low-water mark: under sustained backpressure a
    /// woken publisher gets a run of frames in, where waking it for every
    /// freed frame would cost a wake-up and a waiting publish per message.
    ///
    /// Waiters held by the broker-wide memory limit are served the same way:
    /// the broker drains through its lanes, and every frame taken from a lane
    /// at or below half its budget wakes them. A waiter also looks once more
    /// at its deadline, so room that came without a wake-up is still used.
    pub(crate) fn release(&self, len: usize, lane_drained: bool) {
        if self.release_bytes(len, lane_drained) {
            self.space.notify_waiters();
        }
    }

    /// [`release`](Self::release) without the wake-up: whether the waiting
    /// publishers are owed one (`space.notify_waiters()`), for a caller
    /// that wakes them once its own lock is released.
    #[inline]
    pub(crate) fn release_bytes(&self, len: usize, lane_drained: bool) -> bool {
        self.bytes.fetch_sub(len, Ordering::SeqCst);
        // SeqCst pairs with `waiter_slot`: a waiter that registered before this
        // load is woken; one that registers after it sees the released bytes.
        lane_drained && self.waiters.load(Ordering::SeqCst) > 0
    }

    pub(crate) fn waiter_slot(&self) -> Option<WaiterSlot<'_>> {
        let taken = self.waiters.fetch_add(1, Ordering::SeqCst);
        if taken >= self.max_waiters {
            self.waiters.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(WaiterSlot(self))
    }

    /// Bytes owned by all queues right now.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }
}
