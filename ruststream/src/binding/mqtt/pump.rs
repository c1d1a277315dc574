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
        self.woken.store(true, SeqCst);
        // Whoever polls now looks again when done; the reader's task reads
        // again before it waits.
        if self.polling.load(SeqCst) != NOBODY {
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
        let mut drive = match self.drive.try_lock() {
            Ok(drive) => drive,
            Err(TryLockError::WouldBlock) => return,
            Err(TryLockError::Poisoned(poisoned)) => {
                // It panicked while polled: never polled again.
                let drive = poisoned.into_inner().take();
                self.end();
                drop(drive);
                return;
            }
        };
        self.route.polling.store(who, SeqCst);
        let woken = self.route.woken.swap(false, SeqCst);
        // A drive that yielded to the reader waits for the reader's read
        // (or a wake-up); whoever polls it takes the yield.
        let yielded = (woken || who == READER) && self.route.yielded.swap(false, SeqCst);
        let go = woken || yielded;
        if go
            && let Some(future) = drive.as_mut()
            && future
                .as_mut()
                .poll(&mut Context::from_waker(&self.waker))
                .is_ready()
        {
            *drive = None;
            self.end();
        }
        self.route.polling.store(NOBODY, SeqCst);
        drop(drive);
        if self.route.woken.load(SeqCst) {
            self.route.hand_off();
        }
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
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::*;

    /// A drive that counts its polls and waits for `go` `rounds` times.
    fn counting(go: Arc<Notify>, rounds: usize) -> (Arc<Pump>, Arc<AtomicUsize>) {
        let polls = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&polls);
        let pump = Pump::new(|_| async move {
            for _ in 0..rounds {
                seen.fetch_add(1, SeqCst);
                go.notified().await;
            }
        });
        (pump, polls)
    }

    /// The connection task ends within a bound.
    async fn ends(task: tokio::task::JoinHandle<()>, what: &str) {
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap_or_else(|_| panic!("{what}: not within 5 s"))
            .expect("no panic");
    }

    async fn eventually(what: &str, check: impl Fn() -> bool) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while !check() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
    }

    #[tokio::test]
    async fn the_task_polls_while_nobody_reads_and_ends_with_the_drive() {
        let go = Arc::new(Notify::new());
        let (pump, polls) = counting(Arc::clone(&go), 3);
        let task = tokio::spawn(Arc::clone(&pump).task());
        eventually("the first poll", || polls.load(SeqCst) == 1).await;
        go.notify_one();
        eventually("the second poll", || polls.load(SeqCst) == 2).await;
        go.notify_one();
        eventually("the third poll", || polls.load(SeqCst) == 3).await;
        go.notify_one();
        ends(task, "the task ends with the drive").await;
        assert!(pump.is_done());
    }

    #[tokio::test]
    async fn a_reader_gets_the_wake_ups_and_hands_them_back_when_it_leaves() {
        let go = Arc::new(Notify::new());
        let (pump, polls) = counting(Arc::clone(&go), 4);
        // No task yet: only the reader polls.
        let reader = pump.reader();
        poll_fn(|cx| {
            reader.poll(cx);
            Poll::Ready(())
        })
        .await;
        assert_eq!(polls.load(SeqCst), 1, "the reader polled the drive");
        // Woken while the reader waits: the reader's task is woken, and
        // its next poll drives.
        let woke = poll_fn(|cx| {
            reader.poll(cx);
            if polls.load(SeqCst) == 2 {
                Poll::Ready(())
            } else {
                if polls.load(SeqCst) == 1 {
                    go.notify_one();
                }
                Poll::Pending
            }
        });
        tokio::time::timeout(Duration::from_secs(5), woke)
            .await
            .expect("the reader's task is woken for the drive");
        // The reader leaves with nothing pending; the next wake-up goes to
        // the connection task.
        drop(reader);
        let task = tokio::spawn(Arc::clone(&pump).task());
        go.notify_one();
        eventually("the task's poll", || polls.load(SeqCst) == 3).await;
        go.notify_one();
        eventually("the last poll", || polls.load(SeqCst) == 4).await;
        go.notify_one();
        ends(task, "the task ends with the drive").await;
    }

    #[tokio::test]
    async fn a_wake_up_left_by_the_reader_goes_to_the_task() {
        let go = Arc::new(Notify::new());
        let (pump, polls) = counting(Arc::clone(&go), 2);
        let task = tokio::spawn(Arc::clone(&pump).task());
        eventually("the first poll", || polls.load(SeqCst) == 1).await;
        {
            let reader = pump.reader();
            poll_fn(|cx| {
                reader.poll(cx);
                Poll::Ready(())
            })
            .await;
            // Woken while the reader has the turn, but it leaves before
            // polling again.
            go.notify_one();
        }
        eventually("the task's poll", || polls.load(SeqCst) == 2).await;
        go.notify_one();
        ends(task, "the task ends with the drive").await;
    }

    #[tokio::test]
    async fn the_readers_own_wake_ups_wait_for_its_next_read() {
        let go = Arc::new(Notify::new());
        let (pump, polls) = counting(Arc::clone(&go), 3);
        let task = tokio::spawn(Arc::clone(&pump).task());
        eventually("the first poll", || polls.load(SeqCst) == 1).await;
        let reader = tokio::spawn({
            let (pump, polls, go) = (Arc::clone(&pump), Arc::clone(&polls), Arc::clone(&go));
            async move {
                pump.poke();
                // Woken from the reader's task (as by its ack): nobody
                // else polls, though the connection task had every chance.
                go.notify_one();
                for _ in 0..8 {
                    tokio::task::yield_now().await;
                }
                assert_eq!(polls.load(SeqCst), 1, "left for the reader's next read");
                pump.poke();
                assert_eq!(polls.load(SeqCst), 2, "the reader's next read polls");
            }
        });
        tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .expect("the reader finishes")
            .expect("no panic");
        // Woken from elsewhere: the connection task polls.
        go.notify_one();
        eventually("the task's poll", || polls.load(SeqCst) == 3).await;
        go.notify_one();
        ends(task, "the task ends with the drive").await;
    }

    /// A drive that yields to the reader after each step, then waits for
    /// `go`: counts the steps begun and the ones past the yield.
    fn yielding(go: Arc<Notify>) -> (Arc<Pump>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
        let (begun, past) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (b, p) = (Arc::clone(&begun), Arc::clone(&past));
        let pump = Pump::new(move |turn| async move {
            loop {
                b.fetch_add(1, SeqCst);
                turn.yield_to_reader().await;
                p.fetch_add(1, SeqCst);
                go.notified().await;
            }
        });
        (pump, begun, past)
    }

    /// The reader polls first; the drive stops at its yield.
    async fn read_once(pump: &Pump) {
        let reader = pump.reader();
        poll_fn(|cx| {
            reader.poll(cx);
            Poll::Ready(())
        })
        .await;
    }

    #[tokio::test]
    async fn a_drive_that_yields_to_the_reader_waits_for_its_next_read() {
        let go = Arc::new(Notify::new());
        let (pump, begun, past) = yielding(Arc::clone(&go));
        read_once(&pump).await;
        assert_eq!((begun.load(SeqCst), past.load(SeqCst)), (1, 0));
        let task = tokio::spawn(Arc::clone(&pump).task());
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert_eq!(past.load(SeqCst), 0, "nobody polls it but the reader");
        pump.poke();
        assert_eq!(past.load(SeqCst), 1, "the reader's next read goes on");
        // Woken from elsewhere, the connection task polls, and does not
        // stop at the yield.
        go.notify_one();
        eventually("the task's poll past the yield", || past.load(SeqCst) == 2).await;
        assert_eq!(begun.load(SeqCst), 2);
        pump.stop();
        ends(task, "the task ends once stopped").await;
    }

    #[tokio::test]
    async fn a_released_drive_goes_on_in_the_connection_task() {
        let go = Arc::new(Notify::new());
        let (pump, _, past) = yielding(go);
        read_once(&pump).await;
        let task = tokio::spawn(Arc::clone(&pump).task());
        for _ in 0..8 {
            tokio::task::yield_now().await;
        }
        assert_eq!(past.load(SeqCst), 0, "it waits for the reader");
        // The reader will not read for a while (paused flow, close).
        pump.release();
        eventually("the task's poll past the yield", || past.load(SeqCst) == 1).await;
        pump.stop();
        ends(task, "the task ends once stopped").await;
    }

    #[tokio::test]
    async fn stop_drops_a_drive_that_never_ends() {
        struct Dropped(Arc<AtomicBool>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.store(true, SeqCst);
            }
        }
        let dropped = Arc::new(AtomicBool::new(false));
        let guard = Dropped(Arc::clone(&dropped));
        let pump = Pump::new(|_| async move {
            let _guard = guard;
            std::future::pending::<()>().await;
        });
        let task = tokio::spawn(Arc::clone(&pump).task());
        pump.stop();
        assert!(dropped.load(SeqCst), "the drive was dropped");
        ends(task, "the task ends once stopped").await;
    }
}
