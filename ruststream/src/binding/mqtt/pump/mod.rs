//! A connection's event loop as one future that two tasks take turns to
//! poll: a subscription's reader while it waits for a message, and the
//! connection's own task whenever the reader does not.
//!
//! A raw `rumqttc` consumer reads a publish, handles it and queues its ack in
//! one task, and the next poll of its event loop writes the ack. Driven by a
//! task of its own, the event loop instead handed every publish to the
//! reader and was woken again by every ack: a wake-up each way, and the
//! event loop reading the socket as soon as a byte came (1.6 times the raw
//! loop's socket reads in `bench/brokers.sh`). Polled by the reader, the
//! event loop delivers the publish it reads straight into the reader's
//! buffer and writes the acks the reader queued, with nobody to wake. While
//! the reader is busy (a handler runs, the receive flow is PAUSED, the app
//! stops) the connection task polls: keep-alive, acks from other tasks,
//! reconnects and backpressure go on as before.
//!
//! Polled by the reader, the drive also stops right after it hands over a
//! publish ([`Turn::yield_to_reader`]), as a raw loop stops polling while it
//! handles what it read: going on would only poll the event loop into
//! waiting (one more `select!` round per message, each allocating a waiter
//! in the request channel), to be polled again after the ack anyway. That
//! took a fifth of the framework's instructions per MQTT message.
//!
//! Every resource inside the future (socket, request channel, timers,
//! buffer room) wakes one [`Route`], which wakes the reader while it waits
//! and the connection task otherwise — except a wake-up the reader's own
//! task causes between two reads (its acks, a publish it takes out of a
//! full buffer): that one waits for the reader's next read
//! ([`Pump::poke`] in `try_next`, or `ready`), which the runtime's loops
//! make right after they settle, as a raw loop's next poll writes the acks
//! it queued. Any other wake-up (the socket, the keep-alive timer, another
//! task's ack, close) still wakes the connection task. Whoever polls looks
//! for wake-ups that came meanwhile once it is done, so none is lost, and a
//! wake-up during a poll goes through the scheduler (never a loop here:
//! Tokio's cooperative budget wakes a task whose budget is spent and
//! expects it to yield).
//!
//! Two things count as wake-ups besides the resources': a reader's read
//! that finds the other one polling (a drive that yielded waits for exactly
//! that read, which the other one would not take unwoken), and a poll cut
//! short by the poller's cooperative budget (Tokio leaves that wake-up to
//! the poller's own scheduler, which a `threads(n)` thread parked on its
//! ring does not run). Either lost, a subscription waited for its
//! keep-alive with its receive maximum of messages unacked.

use std::future::{Future, poll_fn};
use std::hash::{Hash, Hasher};
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU8;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex, TryLockError};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

type Drive = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Who polls the drive now (`Route::polling`).
const NOBODY: u8 = 0;
const READER: u8 = 1;
const TASK: u8 = 2;

/// The event loop, to be polled by the reader or by [`Pump::task`].
pub(super) struct Pump {
    /// `None` once it has ended (or was stopped).
    drive: Mutex<Option<Drive>>,
    route: Arc<Route>,
    /// `route` as the waker the drive is polled with.
    waker: Waker,
}

/// Where the drive's wake-ups go.
struct Route {
    /// Woken and not polled since.
    woken: AtomicBool,
    /// The drive handed the reader a publish and yielded ([`Turn`]): the
    /// reader's next read polls it again, and nobody is woken for it.
    yielded: AtomicBool,
    /// The reader waits for a message and polls the drive itself.
    reading: AtomicBool,
    /// `NOBODY`, `READER` or `TASK`.
    polling: AtomicU8,
    done: AtomicBool,
    reader: AtomicWaker,
    /// The reader's task ([`task_bits`]; 0: none yet), whose own wake-ups
    /// wait for its next read. An atomic rather than a lock: it is read on
    /// every wake-up and written on every read.
    reader_task: AtomicU64,
    task: AtomicWaker,
}

impl Route {
    fn on_reader_task(&self) -> bool {
        let current = task_bits();
        current != 0 && self.reader_task.load(SeqCst) == current
    }

    /// The current task reads.
    fn set_reader_task(&self) {
        let current = task_bits();
        // Written only when it changes: the cache line stays shared.
        if self.reader_task.load(Relaxed) != current {
            self.reader_task.store(current, SeqCst);
        }
    }

    /// Marks the drive woken; `true` if somebody polls it now, who looks
    /// for the wake-up when done ([`after_poll`](Self::after_poll)).
    fn woken_while_polled(&self) -> bool {
        self.woken.store(true, SeqCst);
        self.polling.load(SeqCst) != NOBODY
    }

    /// After a poll (`polling` back to `NOBODY`, the drive unlocked): a
    /// wake-up that came meanwhile goes to whoever is to poll now.
    fn after_poll(&self) {
        if self.woken.load(SeqCst) {
            self.hand_off();
        }
    }

    /// Wakes whoever is to poll now.
    fn hand_off(&self) {
        if self.reading.load(SeqCst) {
            self.reader.wake();
        } else {
            self.task.wake();
        }
    }
}

/// The current task's id as a number (0 outside a task). Tokio's task id
/// hashes as the `u64` it is; a hasher that keeps what it is given reads it.
fn task_bits() -> u64 {
    /// Keeps the last `u64` written.
    #[derive(Default)]
    struct Bits(u64);
    impl Hasher for Bits {
        fn finish(&self) -> u64 {
            self.0
        }
        fn write(&mut self, bytes: &[u8]) {
            // Not how a task id hashes today; any stable mix keeps ids apart.
            for &byte in bytes {
                self.0 = self.0.rotate_left(8) ^ u64::from(byte);
            }
        }
        fn write_u64(&mut self, n: u64) {
            self.0 = n;
        }
    }
    tokio::task::try_id().map_or(0, |id| {
        let mut bits = Bits::default();
        id.hash(&mut bits);
        // An id is never 0 (it is a `NonZeroU64`); keep 0 for "none".
        bits.finish().max(1)
    })
}

impl Wake for Route {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Whoever polls now looks again when done; the reader's task reads
        // again before it waits.
        if self.woken_while_polled() {
            return;
        }
        if self.reading.load(SeqCst) {
            self.reader.wake();
        } else if !self.on_reader_task() {
            self.task.wake();
        }
    }
}

impl Pump {
    /// The pump of the drive `make` returns; the drive gets its [`Turn`].
    pub(super) fn new<F>(make: impl FnOnce(Turn) -> F) -> Arc<Pump>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let route = Arc::new(Route {
            // The first poll starts it.
            woken: AtomicBool::new(true),
            yielded: AtomicBool::new(false),
            reading: AtomicBool::new(false),
            polling: AtomicU8::new(NOBODY),
            done: AtomicBool::new(false),
            reader: AtomicWaker::new(),
            reader_task: AtomicU64::new(0),
            task: AtomicWaker::new(),
        });
        let drive = make(Turn(Arc::clone(&route)));
        Arc::new(Pump {
            drive: Mutex::new(Some(Box::pin(drive))),
            waker: Waker::from(Arc::clone(&route)),
            route,
        })
    }

    /// The connection task: polls the drive while the reader does not,
    /// until the drive ends.
    pub(super) async fn task(self: Arc<Self>) {
        poll_fn(|cx| {
            self.route.task.register(cx.waker());
            if !self.route.reading.load(SeqCst) {
                self.run(TASK);
            }
            if self.route.done.load(SeqCst) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// The reader's turn: while the returned guard lives, wake-ups go to
    /// the task of the context it polls with.
    pub(super) fn reader(&self) -> Reader<'_> {
        Reader(self)
    }

    /// The reader's turn between two deliveries: polls the drive if it was
    /// woken (by this task's acks, say), which then wakes nobody.
    pub(super) fn poke(&self) {
        self.route.set_reader_task();
        if self.route.woken.load(SeqCst) || self.route.yielded.load(SeqCst) {
            self.run(READER);
        }
    }

    /// The reader will not read for a while (it waits for the receive flow,
    /// or the connection closes): what waits for its next read — a drive
    /// that yielded to it, a wake-up its own acks caused — goes to the
    /// connection task. (Without this, the acks a stopping app made last
    /// waited for a read that never came, and its DISCONNECT with them.)
    pub(super) fn release(&self) {
        let yielded = self.route.yielded.swap(false, SeqCst);
        if yielded || self.route.woken.load(SeqCst) {
            self.route.woken.store(true, SeqCst);
            self.route.task.wake();
        }
    }

    /// Whether the drive has ended.
    #[cfg(test)]
    fn is_done(&self) -> bool {
        self.route.done.load(SeqCst)
    }

    /// Drops the drive if it has not ended (its task was aborted).
    pub(super) fn stop(&self) {
        let drive = self.drive.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.end();
        drop(drive);
    }

    /// The drive is gone: the task ends, the reader looks again.
    fn end(&self) {
        self.route.done.store(true, SeqCst);
        self.route.task.wake();
        self.route.reader.wake();
    }

    /// Polls the drive as `who` if it was woken; returns at once if the
    /// other one polls (it looks for the wake-up when done).
    fn run(&self, who: u8) {
        let mut drive = loop {
            match self.drive.try_lock() {
                Ok(drive) => break drive,
                Err(TryLockError::WouldBlock) => {
                    if who == READER && self.route.yielded.load(SeqCst) {
                        // The read a yielded drive waits for: left as a
                        // wake-up for whoever polls (which the connection
                        // task, polling when not woken, would not take).
                        if self.route.woken_while_polled() {
                            return;
                        }
                        // It is taking or leaving the lock: try again.
                        std::thread::yield_now();
                        continue;
                    }
                    return;
                }
                Err(TryLockError::Poisoned(poisoned)) => {
                    // It panicked while polled: never polled again.
                    let drive = poisoned.into_inner().take();
                    self.end();
                    drop(drive);
                    return;
                }
            }
        };
        self.route.polling.store(who, SeqCst);
        let woken = self.route.woken.swap(false, SeqCst);
        // A drive that yielded to the reader waits for the reader's read
        // (or a wake-up); whoever polls it takes the yield.
        let yielded = (woken || who == READER) && self.route.yielded.swap(false, SeqCst);
        let go = woken || yielded;
        if go && let Some(future) = drive.as_mut() {
            match future.as_mut().poll(&mut Context::from_waker(&self.waker)) {
                Poll::Ready(()) => {
                    *drive = None;
                    self.end();
                }
                // Stopped by the poller's cooperative budget, not by a
                // resource: Tokio leaves that wake-up to the poller's
                // scheduler, which a dedicated thread parking itself on its
                // ring does not run. It goes to whoever is to poll now.
                Poll::Pending if !tokio::task::coop::has_budget_remaining() => {
                    self.route.woken.store(true, SeqCst);
                }
                Poll::Pending => {}
            }
        }
        self.route.polling.store(NOBODY, SeqCst);
        drop(drive);
        self.route.after_poll();
    }
}

/// What the drive knows of who polls it.
pub(super) struct Turn(Arc<Route>);

impl Turn {
    /// After the drive handed the reader a publish. Polled by the reader,
    /// the drive stops here until the reader's next read (`poke` or
    /// `ready`), as a raw loop stops polling its event loop while it handles
    /// what it read: no poll that only registers for the next packet, and
    /// no wake-up. Polled by the connection task, it goes on reading.
    ///
    /// While it stops, nothing of the event loop is registered but its
    /// keep-alive timer (which wakes the connection task as before), so the
    /// reader must come back. It does: a drive stops only with a publish in
    /// the buffer, and the runtime takes it with its next `try_next` — at
    /// once, or when a job permit, an idle worker or room in a thread's ring
    /// comes free, none of which waits for this connection. Until then the
    /// acks of other tasks (workers, threads) wait in the request channel,
    /// as the deliveries do. A reader that stops reading (a paused receive
    /// flow, a closing connection) calls [`Pump::release`].
    pub(super) async fn yield_to_reader(&self) {
        let mut yielded = false;
        poll_fn(|_| {
            if yielded || self.0.polling.load(SeqCst) != READER {
                return Poll::Ready(());
            }
            yielded = true;
            self.0.yielded.store(true, SeqCst);
            Poll::Pending
        })
        .await;
    }
}

/// The reader's turn at the drive (see [`Pump::reader`]).
pub(super) struct Reader<'a>(&'a Pump);

impl Reader<'_> {
    /// Polls the drive from `cx`'s task; its wake-ups wake that task until
    /// this guard is dropped.
    pub(super) fn poll(&self, cx: &Context<'_>) {
        let route = &self.0.route;
        route.set_reader_task();
        route.reader.register(cx.waker());
        route.reading.store(true, SeqCst);
        self.0.run(READER);
    }
}

impl Drop for Reader<'_> {
    /// Back to the connection task, with a wake-up the reader left. (A
    /// drive that yielded to the reader stays with it: the reader leaves
    /// with a publish at hand, to take it with `try_next`.)
    fn drop(&mut self) {
        let route = &self.0.route;
        route.reading.store(false, SeqCst);
        if route.woken.load(SeqCst) {
            route.task.wake();
        }
    }
}

#[cfg(test)]
mod tests;
