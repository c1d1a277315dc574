//! The job queue's permits: the lock-free spare fast path beside the FIFO
//! semaphore.

use std::sync::Arc;

use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use loom::thread;

use super::check;
use crate::ingress::{JobQueue, JobQueueSettings, PressureState};

fn queue(max: usize) -> Arc<JobQueue> {
    JobQueue::new(&JobQueueSettings::default().max_queued_jobs(max)).unwrap()
}

/// A permit given back while a source starts waiting reaches it: the spare
/// permits and the semaphore never strand one (a stranded permit shows as a
/// deadlock), and none is lost or made.
#[test]
fn a_permit_given_back_reaches_a_source_that_starts_waiting() {
    check(|| {
        let jobs = queue(1);
        let held = jobs.try_acquire().expect("one free permit");
        let waiter = {
            let jobs = Arc::clone(&jobs);
            thread::spawn(move || drop(block_on(jobs.acquire())))
        };
        drop(held);
        waiter.join().unwrap();
        assert_eq!(jobs.pressure().in_use, 0);
        let again = jobs.try_acquire();
        assert!(again.is_some(), "the permit was lost");
        assert!(jobs.try_acquire().is_none(), "a permit was made");
    });
}

/// A loop that gives its permit back while another source waits cannot
/// take it again on the fast path: it is the waiting source's.
#[test]
fn the_fast_path_never_overtakes_a_waiting_source() {
    check(|| {
        let jobs = queue(1);
        let held = jobs.try_acquire().expect("one free permit");
        let checked = Arc::new(AtomicBool::new(false));
        let waiter = {
            let jobs = Arc::clone(&jobs);
            let checked = Arc::clone(&checked);
            thread::spawn(move || {
                let permit = block_on(jobs.acquire());
                // Held until the other side looked.
                while !checked.load(Ordering::SeqCst) {
                    thread::yield_now();
                }
                drop(permit);
            })
        };
        while jobs.waiters() == 0 {
            thread::yield_now();
        }
        drop(held);
        let overtook = jobs.try_acquire();
        assert!(overtook.is_none(), "took the permit a source waits for");
        checked.store(true, Ordering::SeqCst);
        waiter.join().unwrap();
    });
}

/// A source counted as waiting holds its place in the FIFO: a loop that
/// gives its permit back and waits for another is served after it (JQ-7).
/// Counted before it was queued, a waiter paused between the two steps let
/// every release of that pause go to the next taker.
#[test]
fn a_counted_waiter_is_served_before_a_loop_that_waits_after_it() {
    check(|| {
        let jobs = queue(1);
        let held = jobs.try_acquire().expect("one free permit");
        let first = Arc::new(AtomicUsize::new(0));
        let waiter = {
            let jobs = Arc::clone(&jobs);
            let first = Arc::clone(&first);
            thread::spawn(move || {
                let permit = block_on(jobs.acquire());
                let _ = first.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst);
                drop(permit);
            })
        };
        while jobs.waiters() == 0 {
            thread::yield_now();
        }
        drop(held);
        let permit = block_on(jobs.acquire());
        let _ = first.compare_exchange(0, 2, Ordering::SeqCst, Ordering::SeqCst);
        drop(permit);
        waiter.join().unwrap();
        assert_eq!(
            first.load(Ordering::SeqCst),
            1,
            "a loop that waited after the counted source took the permit first"
        );
    });
}

/// Two sources release and take concurrently: each permit is in one
/// place at a time, so the count in use returns to zero.
#[test]
fn concurrent_takes_and_releases_keep_the_count() {
    check(|| {
        let jobs = queue(1);
        let other = {
            let jobs = Arc::clone(&jobs);
            thread::spawn(move || drop(block_on(jobs.acquire())))
        };
        drop(block_on(jobs.acquire()));
        other.join().unwrap();
        assert_eq!(jobs.pressure().in_use, 0);
        assert!(jobs.try_acquire().is_some());
    });
}

/// A take that crosses the pause threshold races a release that falls to
/// the resume one (JQ-14, JQ-16): whichever way they interleave, the state
/// after both matches the count. Found stuck PAUSED with 1 in use (resume
/// 1) when the release looked at the paused flag before the take's
/// recompute stored it.
#[test]
fn a_release_racing_a_pause_never_leaves_the_state_paused() {
    check(|| {
        // M = 4, P = 50 %: pause at 2; R = 25 %: resume at 1.
        let settings = JobQueueSettings::default()
            .max_queued_jobs(4)
            .pause_resume(50, 25);
        let jobs = JobQueue::new(&settings).unwrap();
        let held = jobs.try_acquire().expect("free");
        let taker = {
            let jobs = Arc::clone(&jobs);
            thread::spawn(move || jobs.try_acquire().expect("free"))
        };
        drop(held);
        let kept = taker.join().unwrap();
        let pressure = jobs.pressure();
        assert_eq!(pressure.in_use, 1);
        assert_eq!(
            pressure.state,
            PressureState::Running,
            "1 in use, resume at 1"
        );
        drop(kept);
    });
}

/// The mirror case: a release that falls to the resume threshold races a
/// take that crosses the pause one from a PAUSED state; after both the
/// state matches the count (PAUSED at 2 in use).
#[test]
fn a_take_racing_a_resume_never_leaves_the_state_running() {
    check(|| {
        let settings = JobQueueSettings::default()
            .max_queued_jobs(4)
            .pause_resume(50, 25);
        let jobs = JobQueue::new(&settings).unwrap();
        let first = jobs.try_acquire().expect("free");
        let second = jobs.try_acquire().expect("free");
        assert_eq!(jobs.pressure().state, PressureState::Paused);
        let releaser = thread::spawn(move || drop(second));
        let third = jobs.try_acquire().expect("free");
        releaser.join().unwrap();
        let pressure = jobs.pressure();
        assert_eq!(pressure.in_use, 2);
        assert_eq!(
            pressure.state,
            PressureState::Paused,
            "2 in use, pause at 2"
        );
        drop((first, third));
    });
}
