//! Job permits and the pressure state they drive.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use super::permit::{BorrowedPermit, JobPermit, Permits};
use super::pressure::{Pressure, PressureState, Thresholds};
use super::settings::JobQueueSettings;
use crate::metrics;
use crate::sync::atomic::{AtomicUsize, Ordering};
use crate::sync::{Mutex, MutexGuard, Semaphore};

/// The bit of [`JobQueue`]'s count word that mirrors a PAUSED state.
const PAUSED: usize = 1 << (usize::BITS - 1);
/// The count word's lower half counts the permits in use, the bits above
/// it (below [`PAUSED`]) the spare ones: a take or a release that moves a
/// permit between the two is one atomic step, not two.
const SPARE_SHIFT: u32 = usize::BITS / 2;
/// One spare permit in the count word.
const ONE_SPARE: usize = 1 << SPARE_SHIFT;
/// The permits in use, in the count word.
const IN_USE: usize = ONE_SPARE - 1;
/// The spare permits, in the count word.
const SPARE: usize = !IN_USE & !PAUSED;
/// The most permits a job queue holds: what each part of its count word
/// can count (2³¹ − 1 on a 64-bit target).
pub(crate) const MAX_PERMITS: usize = (1 << (SPARE_SHIFT - 1)) - 1;

/// A receive-flow switch: the one control point between framework
/// pressure and a binding's receive flow. Called outside every lock
/// of the job queue and its registry, with the absolute state.
pub trait ReceiveFlow: Send + Sync + 'static {
    /// Stops (`true`) or resumes (`false`) receiving.
    fn set_paused(&self, paused: bool);
}

struct Source {
    id: u64,
    flow: Arc<dyn ReceiveFlow>,
    /// The newest transition applied; serializes this source's binding calls
    /// so a stale transition never overwrites a newer one.
    applied_epoch: Mutex<u64>,
}

impl Source {
    fn apply(&self, epoch: u64, state: PressureState) {
        let mut applied = self.applied_epoch.lock();
        if epoch <= *applied && *applied != 0 {
            return;
        }
        *applied = epoch;
        self.flow.set_paused(state == PressureState::Paused);
    }
}

struct Tracker {
    state: PressureState,
    /// Incremented on every transition; 1 is the initial RUNNING state.
    epoch: u64,
    pause_count: u64,
    paused_since: Option<Instant>,
    paused_total: Duration,
    sources: Vec<Arc<Source>>,
    next_source: u64,
}

/// The application job queue: one per running app, shared by every
/// subscription.
pub struct JobQueue {
    /// The FIFO of waiting sources, and the permits no one took yet.
    permits: Semaphore,
    max: usize,
    thresholds: Thresholds,
    /// One word: the permits in use ([`IN_USE`]); the spare ones
    /// ([`SPARE`]), returned while no source waited (all of them at first),
    /// taken back without the semaphore's lock; and in its top bit
    /// ([`PAUSED`]) a mirror of the tracker's state for the lock-free fast
    /// path. So a take or a release moves a permit and reads the state in
    /// one atomic step (see [`recompute`](Self::recompute)). Whenever a
    /// source waits, the spare permits move to `permits` (see
    /// [`release`](Self::release)), so a waiter is never passed over.
    count: AtomicUsize,
    waiters: AtomicUsize,
    tracker: Mutex<Tracker>,
    /// Serializes [`try_acquire_extra`](Self::try_acquire_extra).
    extra: Mutex<()>,
    in_use_gauge: ::metrics::Gauge,
    waiters_gauge: ::metrics::Gauge,
    /// The `app` label of the pressure metrics.
    app: Box<str>,
}

impl std::fmt::Debug for JobQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobQueue")
            .field("pressure", &self.pressure())
            .finish()
    }
}

/// A source's place in the receive registry; dropping it removes the source
/// first, before the source itself closes.
#[must_use = "the source leaves the registry when this is dropped"]
pub struct SourceRegistration {
    queue: Arc<JobQueue>,
    id: u64,
}

impl Drop for SourceRegistration {
    fn drop(&mut self) {
        self.queue.tracker().sources.retain(|s| s.id != self.id);
    }
}

impl JobQueue {
    /// A job queue with validated settings.
    pub fn new(settings: &JobQueueSettings) -> crate::Result<Arc<JobQueue>> {
        JobQueue::for_app(settings, "app")
    }

    /// An app's job queue: its metrics carry the app's name.
    pub(crate) fn for_app(settings: &JobQueueSettings, app: &str) -> crate::Result<Arc<JobQueue>> {
        settings.validate()?;
        let max = settings.effective_max();
        let (pause, resume) = settings.percents();
        Ok(Arc::new(JobQueue {
            // All spare at first, as if returned while no one waited: a
            // loop then takes and returns them without touching the
            // semaphore, and `saturated` answers from the spare ones alone
            // until a source has to wait.
            permits: Semaphore::new(0),
            max,
            thresholds: Thresholds::new(max, pause, resume),
            count: AtomicUsize::new(max << SPARE_SHIFT),
            waiters: AtomicUsize::new(0),
            in_use_gauge: metrics::jobs_in_use(app),
            waiters_gauge: metrics::job_waiters(app),
            app: app.into(),
            extra: Mutex::new(()),
            tracker: Mutex::new(Tracker {
                state: PressureState::Running,
                epoch: 1,
                pause_count: 0,
                paused_since: None,
                paused_total: Duration::ZERO,
                sources: Vec::new(),
                next_source: 1,
            }),
        }))
    }

    fn tracker(&self) -> MutexGuard<'_, Tracker> {
        self.tracker.lock()
    }

    /// Waits for a permit: the oldest waiter is served first.
    /// Cancel-safe: a dropped wait takes nothing.
    pub async fn acquire(self: &Arc<Self>) -> JobPermit {
        self.wait_slot().await;
        JobPermit {
            queue: Arc::clone(self),
        }
    }

    /// A permit if one is free now and no source waits for one.
    #[inline(always)]
    pub fn try_acquire(self: &Arc<Self>) -> Option<JobPermit> {
        self.try_slot().then(|| JobPermit {
            queue: Arc::clone(self),
        })
    }

    /// A permit for a binding's read-ahead (a record it asks for beyond the
    /// one a loop waits for, see
    /// [`Subscription::use_job_queue`](crate::Subscription::use_job_queue)):
    /// taken only while at least one more stays free. Buffered records then
    /// never hold every permit while a loop waits for one to take them out
    /// of the buffer (no wait cycle on one authority).
    pub fn try_acquire_extra(self: &Arc<Self>) -> Option<JobPermit> {
        // One extra taker at a time, so two never take the last two.
        let _serial = self.extra.lock();
        let free = spare_of(self.count.load(Ordering::Acquire)) + self.permits.available_permits();
        if free < 2 {
            return None;
        }
        self.try_acquire()
    }

    /// [`acquire`](Self::acquire) for a loop that keeps the queue alive
    /// itself: the permit borrows it, with no reference count to move.
    pub(crate) async fn acquire_borrowed(&self) -> BorrowedPermit<'_> {
        self.wait_slot().await;
        BorrowedPermit(self)
    }

    /// [`try_acquire`](Self::try_acquire), borrowing the queue.
    #[inline(always)]
    pub(crate) fn try_acquire_borrowed(&self) -> Option<BorrowedPermit<'_>> {
        self.try_slot().then(|| BorrowedPermit(self))
    }

    /// Up to `n` permits that are free now, as one count (none while a
    /// source waits for one: a batch never overtakes a waiter).
    pub(crate) fn try_acquire_up_to(&self, n: usize) -> Permits<'_> {
        let mut got = 0;
        if n > 0 && self.waiters.load(Ordering::SeqCst) == 0 {
            got = self.take_spares(n);
            let mut from_semaphore = 0;
            while got + from_semaphore < n {
                match self.permits.try_acquire() {
                    Ok(permit) => permit.forget(),
                    Err(_) => break,
                }
                from_semaphore += 1;
            }
            if from_semaphore > 0 {
                self.taken_n(from_semaphore);
                got += from_semaphore;
            }
        }
        Permits {
            queue: self,
            n: got,
        }
    }

    /// No permits, to add to (see [`Permits::adopt`]).
    pub(crate) fn no_permits(&self) -> Permits<'_> {
        Permits { queue: self, n: 0 }
    }

    /// Waits for a slot, oldest waiter first.
    ///
    /// A source counts as waiting only once it holds its place in the
    /// semaphore's queue: the first poll queues it (or takes a permit), and
    /// only then does the count go up. Counted first, a source that the OS
    /// paused between the two steps was passed over by every release of
    /// that pause (each one left its permit free in the semaphore, for the
    /// next taker to find), while the count said it waited.
    async fn wait_slot(&self) {
        if self.try_slot() {
            return;
        }
        let mut acquire = pin!(self.permits.acquire());
        let acquired = match poll_fn(|cx| Poll::Ready(acquire.as_mut().poll(cx))).await {
            Poll::Ready(acquired) => acquired,
            Poll::Pending => {
                // SeqCst, before the spare permits move: pairs with `release`.
                let waiters = self.waiters.fetch_add(1, Ordering::SeqCst) + 1;
                self.waiters_gauge.set(waiters as f64);
                let _waiting = Waiting(self);
                self.return_spare();
                acquire.await
            }
        };
        match acquired {
            Ok(permit) => permit.forget(),
            Err(_) => unreachable!("the job queue's semaphore is never closed"),
        }
        self.taken();
    }

    /// Takes a slot if one is free now and no source waits for one: a
    /// permit given back while a source waits is that source's, in the
    /// semaphore or still spare, so the fast path never overtakes it.
    /// Always inlined, as are `try_acquire` and `try_acquire_borrowed`: a
    /// loop takes one per delivery, and the compiler left them out of line once
    /// the loop grew (a call and its register saves, ~10 instructions).
    #[inline(always)]
    fn try_slot(&self) -> bool {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            return false;
        }
        if self.take_spares(1) == 1 {
            return true;
        }
        match self.permits.try_acquire() {
            Ok(permit) => permit.forget(),
            Err(_) => return false,
        }
        self.taken();
        true
    }

    /// Puts up to `n` spare permits in use, in one step; how many.
    #[inline]
    fn take_spares(&self, n: usize) -> usize {
        let mut word = self.count.load(Ordering::Relaxed);
        loop {
            let take = spare_of(word).min(n);
            if take == 0 {
                return 0;
            }
            let next = word - take * ONE_SPARE + take;
            match self
                .count
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.after_take(next);
                    return take;
                }
                Err(now) => word = now,
            }
        }
    }

    /// Moves the spare permits to the semaphore, which hands them to the
    /// waiters in order.
    fn return_spare(&self) {
        let spare = spare_of(self.count.fetch_and(!SPARE, Ordering::SeqCst));
        if spare > 0 {
            self.permits.add_permits(spare);
        }
    }

    /// One permit from the semaphore in use.
    #[inline]
    fn taken(&self) {
        self.taken_n(1);
    }

    /// `n` permits from the semaphore in use.
    #[inline]
    fn taken_n(&self, n: usize) {
        let word = self.count.fetch_add(n, Ordering::AcqRel) + n;
        self.after_take(word);
    }

    /// The gauge, and the pause threshold, after a take that left `word`.
    #[inline]
    fn after_take(&self, word: usize) {
        let in_use = word & IN_USE;
        self.in_use_gauge.set(in_use as f64);
        if word & PAUSED == 0 && in_use >= self.thresholds.pause {
            self.recompute();
        }
    }

    #[inline]
    pub(super) fn release(&self) {
        self.release_n(1);
    }

    #[inline]
    pub(super) fn release_n(&self, n: usize) {
        let word = if self.waiters.load(Ordering::SeqCst) == 0 {
            // No one waits: from in use to spare in one step, lock-free
            // (the permits in use are at least `n`, so the lower half
            // gives up `n` without borrowing from the spare ones).
            let moved = n * ONE_SPARE - n;
            let word = self.count.fetch_add(moved, Ordering::SeqCst) + moved;
            // A source that started waiting meanwhile moved the spares
            // before this one arrived, or is seen here (both sides SeqCst:
            // its count goes up before it moves them, this permit before
            // this look).
            if self.waiters.load(Ordering::SeqCst) > 0 {
                self.return_spare();
            }
            word
        } else {
            let word = self.count.fetch_sub(n, Ordering::AcqRel) - n;
            self.permits.add_permits(n);
            word
        };
        let in_use = word & IN_USE;
        self.in_use_gauge.set(in_use as f64);
        if word & PAUSED != 0 && in_use <= self.thresholds.resume {
            self.recompute();
        }
    }

    /// Whether no permit is free right now: every one is in use or handed
    /// to a waiting source. A loop that took the last one lets the other
    /// tasks of its runtime run before it takes another (a source
    /// that had its turn goes behind the others), so sources sharing few
    /// permits take turns even when they run on one worker thread.
    #[inline]
    pub(crate) fn saturated(&self) -> bool {
        self.count.load(Ordering::Relaxed) & SPARE == 0 && self.permits.available_permits() == 0
    }

    /// Recomputes the state from the current count; applies a change to every
    /// registered source outside the lock.
    ///
    /// A take or release reads the [`PAUSED`] bit in the same atomic step
    /// that changes the count, and leaves the state to this function only
    /// when that bit and its count disagree. The bit is set or cleared by a
    /// compare-and-swap that succeeds only on the very count the decision
    /// was made from: a take or release that comes first makes it fail and
    /// decide again, one that comes after sees the new bit. A transition
    /// is never lost (JQ-16) — an earlier version read the count and stored
    /// the bit in two steps, and a release between them left the state
    /// PAUSED with nothing in use.
    fn recompute(&self) {
        let Some((epoch, state, sources)) = self.transition() else {
            return;
        };
        metrics::pressure_transition(&self.app, state == PressureState::Paused);
        for source in sources {
            source.apply(epoch, state);
        }
    }

    /// The next state under the lock, if the count calls for a change:
    /// its epoch and the sources to apply it to.
    fn transition(&self) -> Option<(u64, PressureState, Vec<Arc<Source>>)> {
        let mut t = self.tracker();
        let mut word = self.count.load(Ordering::Acquire);
        let next = loop {
            let next = self.thresholds.next(t.state, word & IN_USE);
            if next == t.state {
                return None;
            }
            let flagged = match next {
                PressureState::Paused => word | PAUSED,
                PressureState::Running => word & !PAUSED,
            };
            match self.count.compare_exchange_weak(
                word,
                flagged,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break next,
                Err(now) => word = now,
            }
        };
        t.state = next;
        t.epoch += 1;
        let now = Instant::now();
        match next {
            PressureState::Paused => {
                t.pause_count += 1;
                t.paused_since = Some(now);
            }
            PressureState::Running => {
                if let Some(since) = t.paused_since.take() {
                    t.paused_total += now - since;
                }
                metrics::paused_seconds(&self.app, t.paused_total);
            }
        }
        Some((t.epoch, next, t.sources.clone()))
    }

    /// Registers a source's receive-flow switch. It gets the current state
    /// before it is published to the registry.
    pub fn register(self: &Arc<Self>, flow: Arc<dyn ReceiveFlow>) -> SourceRegistration {
        let (id, epoch, state) = {
            let mut t = self.tracker();
            t.next_source += 1;
            (t.next_source, t.epoch, t.state)
        };
        let source = Arc::new(Source {
            id,
            flow,
            applied_epoch: Mutex::new(0),
        });
        source.apply(epoch, state);
        let (latest_epoch, latest_state) = {
            let mut t = self.tracker();
            t.sources.push(Arc::clone(&source));
            (t.epoch, t.state)
        };
        // A transition between the two locks did not see this source yet.
        if latest_epoch != epoch {
            source.apply(latest_epoch, latest_state);
        }
        SourceRegistration {
            queue: Arc::clone(self),
            id,
        }
    }

    /// Current pressure observation.
    pub fn pressure(&self) -> Pressure {
        let t = self.tracker();
        let current_pause = t.paused_since.map_or(Duration::ZERO, |s| s.elapsed());
        Pressure {
            state: t.state,
            in_use: self.count.load(Ordering::Acquire) & IN_USE,
            max: self.max,
            waiters: self.waiters(),
            pause_count: t.pause_count,
            paused_for: t.paused_total + current_pause,
        }
    }

    /// Sources waiting for a permit.
    pub fn waiters(&self) -> usize {
        self.waiters.load(Ordering::Relaxed)
    }

    /// The thresholds in force.
    pub fn thresholds(&self) -> Thresholds {
        self.thresholds
    }
}

struct Waiting<'a>(&'a JobQueue);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let waiters = self.0.waiters.fetch_sub(1, Ordering::SeqCst) - 1;
        self.0.waiters_gauge.set(waiters as f64);
    }
}

/// The spare permits in a count word.
#[inline]
fn spare_of(word: usize) -> usize {
    (word & SPARE) >> SPARE_SHIFT
}

#[cfg(test)]
mod tests {
    use super::JobQueue;
    use crate::ingress::JobQueueSettings;

    #[test]
    fn a_count_of_permits_takes_what_is_free_and_returns_it_all() {
        let jobs = JobQueue::new(&JobQueueSettings::default().max_queued_jobs(8)).unwrap();
        let single = jobs.try_acquire_borrowed().unwrap();
        let mut held = jobs.try_acquire_up_to(10);
        assert_eq!(held.len(), 7, "only what is free");
        assert!(jobs.try_acquire_up_to(1).is_empty());
        held.adopt(single);
        held.truncate(5);
        assert_eq!(jobs.pressure().in_use, 5);
        // From the spare permits just returned, then from the semaphore.
        let more = jobs.try_acquire_up_to(2);
        held.merge(more);
        assert_eq!((held.len(), jobs.pressure().in_use), (7, 7));
        drop(held);
        assert_eq!(jobs.pressure().in_use, 0);
        assert_eq!(jobs.try_acquire_up_to(100).len(), 8, "every permit back");
    }
}
