//! The job queue's permits: the lock-free spare fast path beside the FIFO
//! semaphore.

use std::sync::Arc;

use loom::future::block_on;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

use super::check;
use crate::ingress::{JobQueue, JobQueueSettings};

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
