//! How a dedicated thread waits for its ring.
//!
//! Waiting in Tokio's driver costs a turn of its time and I/O drivers per
//! wake-up (~750 instructions, once per ring batch: a large share of what a
//! `threads(n)` delivery costs). While the thread's runtime has no task of
//! its own (a handler may `tokio::spawn` there), nothing but the ring
//! can give it work, so it parks the OS thread on the ring instead and the
//! feeder's wake-up is one futex call. With tasks alive it waits in Tokio's
//! driver, so they run.
//!
//! Parking and unparking cost a futex call each and a context switch, for
//! at most a ring of 8 deliveries: more than the deliveries themselves when
//! the handler is quick. So before it parks, a thread whose ring is empty
//! gives its CPU away a few times ([`SNOOZES`], `sched_yield`): the feeder,
//! often waiting for that very CPU, refills the ring meanwhile, and the
//! thread goes on without having slept. This is what idle workers of
//! thread pools like Rayon do before they sleep.
//!
//! A task spawned onto an idle thread's runtime from another thread (through
//! a captured `Handle`) wakes Tokio's driver, not the parked thread: the
//! thread sees it at the next [`RECHECK`] and switches to Tokio's driver.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

use tokio::runtime::RuntimeMetrics;

use super::ring::Ring;
use super::snooze_backoff::SnoozeBackoff;

/// How often a parked thread looks for tasks spawned onto its runtime from
/// elsewhere.
pub(crate) const RECHECK: Duration = Duration::from_millis(100);

/// How many times an idle thread gives its CPU away before it parks: on a
/// 2-core machine running `threads(4)` with a small handler, 4–10 of them
/// avoided almost every park (≈22,000 → ≈200 per 200,000 deliveries) when
/// the feeder filled every ring; now that busy threads claim in place,
/// threads go idle far less often on a backlog.
pub(crate) const SNOOZES: usize = 8;

pub(crate) struct RingWait {
    /// Wakes this OS thread out of `std::thread::park`.
    unpark: Waker,
    runtime: RuntimeMetrics,
    snooze: SnoozeBackoff,
}

impl RingWait {
    /// For the calling thread; call it inside the thread's runtime.
    pub(crate) fn new() -> Self {
        RingWait {
            unpark: Waker::from(Arc::new(Unpark(std::thread::current()))),
            runtime: tokio::runtime::Handle::current().metrics(),
            snooze: SnoozeBackoff::new(),
        }
    }

    /// [`Ring::take_all`], parking the OS thread while the runtime is idle.
    pub(crate) async fn take_all<T>(&mut self, ring: &Ring<T>, taken: &mut VecDeque<T>) -> bool {
        let runtime = &self.runtime;
        let idle = || runtime.num_alive_tasks() == 0;
        if idle() {
            if !ring.has_items() {
                self.snooze
                    .snooze(SNOOZES, || ring.has_items().then_some(()));
            }
            if let Some(more) = ring.take_all_parked(taken, &self.unpark, RECHECK, idle) {
                return more;
            }
        }
        ring.take_all(taken).await
    }
}

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}
