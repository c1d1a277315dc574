//! The job queue's permits and pressure state through its public API
//! (`ruststream::ingress`): JQ-24 items 2, 11 and 12, oldest-waiter-first
//! with three sources, and no permit leaked by a cancelled wait.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ruststream::ingress::{JobQueue, JobQueueSettings, PressureState, ReceiveFlow};

#[derive(Default)]
struct Switch {
    calls: Mutex<Vec<bool>>,
}

impl ReceiveFlow for Switch {
    fn set_paused(&self, paused: bool) {
        self.calls.lock().unwrap().push(paused);
    }
}

fn queue(max: usize) -> Arc<JobQueue> {
    JobQueue::new(&JobQueueSettings::default().max_queued_jobs(max)).unwrap()
}

/// JQ-24 item 11: 80% pause, 60% resume, hysteresis between — exact.
#[tokio::test]
async fn jq24_11_pause_resume_hysteresis() {
    let q = queue(10);
    let switch = Arc::new(Switch::default());
    let _reg = q.register(switch.clone());
    let mut held = Vec::new();
    for _ in 0..7 {
        held.push(q.acquire().await);
    }
    assert_eq!(q.pressure().state, PressureState::Running, "7 < pause 8");
    held.push(q.acquire().await);
    assert_eq!(
        q.pressure().state,
        PressureState::Paused,
        "8 = ceil(10*80/100)"
    );
    held.push(q.acquire().await);
    held.pop();
    held.pop();
    assert_eq!(
        q.pressure().state,
        PressureState::Paused,
        "7: between, holds"
    );
    held.pop();
    assert_eq!(q.pressure().in_use, 6);
    assert_eq!(
        q.pressure().state,
        PressureState::Running,
        "6 = floor(10*60/100)"
    );
    held.push(q.acquire().await);
    assert_eq!(
        q.pressure().state,
        PressureState::Running,
        "7: between, holds"
    );
    // Applied once per change, never re-applied: initial RUNNING, then
    // PAUSED, then RUNNING.
    assert_eq!(*switch.calls.lock().unwrap(), [false, true, false]);
    assert_eq!(q.pressure().pause_count, 1);
    drop(held);
    assert_eq!(q.pressure().in_use, 0, "every permit returned exactly once");
}

/// JQ-24 item 2: reservations and queued jobs count; waiters without a
/// permit do not; only returning a permit lowers the count.
#[tokio::test(start_paused = true)]
async fn jq24_2_permit_count_rule() {
    let q = queue(2);
    let a = q.acquire().await;
    let b = q.acquire().await;
    assert_eq!(q.pressure().in_use, 2);
    let waiting = tokio::spawn({
        let q = Arc::clone(&q);
        async move { q.acquire().await }
    });
    tokio::task::yield_now().await;
    assert_eq!(q.waiters(), 1);
    assert_eq!(q.pressure().in_use, 2, "a waiter is not counted");
    drop(a);
    let c = waiting.await.unwrap();
    assert_eq!(q.pressure().in_use, 2, "the permit moved to the waiter");
    drop((b, c));
    assert_eq!(q.pressure().in_use, 0);
}

/// JQ-7: permits go to the oldest waiter first.
#[tokio::test(start_paused = true)]
async fn oldest_waiter_first_with_three_sources() {
    let q = queue(1);
    let held = q.acquire().await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut sources = Vec::new();
    for source in 0..3 {
        let q = Arc::clone(&q);
        let order = Arc::clone(&order);
        sources.push(tokio::spawn(async move {
            let permit = q.acquire().await;
            order.lock().unwrap().push(source);
            drop(permit);
        }));
        // Each source is queued before the next one starts waiting.
        tokio::task::yield_now().await;
    }
    assert_eq!(q.waiters(), 3);
    drop(held);
    for s in sources {
        s.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
}

/// JQ-11: a cancelled wait takes nothing and returns nothing twice.
#[tokio::test(start_paused = true)]
async fn cancelled_wait_leaks_no_permit() {
    let q = queue(1);
    let held = q.acquire().await;
    let cancelled = tokio::time::timeout(Duration::from_secs(1), q.acquire()).await;
    assert!(cancelled.is_err());
    assert_eq!(q.waiters(), 0);
    drop(held);
    assert_eq!(q.pressure().in_use, 0);
    let again = q.try_acquire().expect("the permit is free again");
    drop(again);
    assert_eq!(q.pressure().in_use, 0);
}

/// JQ-24 item 12: a new source gets the current state before it joins;
/// a closed source gets nothing more; concurrent transitions end in the
/// latest absolute state on every source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_12_new_source_sync_close_and_stale_transitions() {
    let q = queue(10);
    let mut held: Vec<_> = (0..8).map(|_| q.try_acquire().unwrap()).collect();
    let late = Arc::new(Switch::default());
    let reg = q.register(late.clone());
    assert_eq!(*late.calls.lock().unwrap(), [true], "joined while PAUSED");
    drop(reg);
    held.truncate(6);
    assert_eq!(q.pressure().state, PressureState::Running);
    assert_eq!(
        *late.calls.lock().unwrap(),
        [true],
        "removed before closing"
    );

    // Many threads flip the state back and forth; every source ends in
    // the state the final count implies.
    let switches: Vec<_> = (0..4).map(|_| Arc::new(Switch::default())).collect();
    let regs: Vec<_> = switches.iter().map(|s| q.register(s.clone())).collect();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let q = Arc::clone(&q);
            tokio::spawn(async move {
                // One permit at a time: holding some while waiting for
                // more would be a wait cycle (JQ-11).
                for _ in 0..5000 {
                    let permit = q.acquire().await;
                    tokio::task::yield_now().await;
                    drop(permit);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let pressure = q.pressure();
    assert!(pressure.pause_count > 1, "the state flipped under load");
    assert_eq!(
        pressure.state,
        PressureState::Running,
        "6 held: resume level"
    );
    for s in &switches {
        let last = *s.calls.lock().unwrap().last().unwrap();
        assert!(!last, "a stale PAUSED never overwrites the final RUNNING");
    }
    drop(regs);
    drop(held);
    assert_eq!(q.pressure().in_use, 0);
}

/// JQ-3: invalid percents are a clear startup error.
#[test]
fn invalid_settings_are_refused() {
    for (p, r) in [(0, 0), (101, 50), (80, 100), (60, 60), (50, 70)] {
        let err = JobQueue::new(&JobQueueSettings::default().pause_resume(p, r)).unwrap_err();
        assert!(
            matches!(err, ruststream::Error::Config(_)),
            "{p}/{r}: {err:?}"
        );
    }
    assert!(JobQueue::new(&JobQueueSettings::default().max_queued_jobs(0)).is_err());
}

/// JQ-3: a permit count above what a job queue can count is a clear
/// startup error, not a queue that miscounts; the largest it can count
/// works like any other.
#[test]
fn a_permit_count_past_the_largest_is_refused() {
    let largest = (1usize << (usize::BITS / 2 - 1)) - 1;
    let err = JobQueue::new(&JobQueueSettings::default().max_queued_jobs(largest + 1)).unwrap_err();
    assert!(
        matches!(&err, ruststream::Error::Config(text) if text.contains(&largest.to_string())),
        "{err:?}"
    );
    assert!(JobQueue::new(&JobQueueSettings::default().max_queued_jobs(usize::MAX)).is_err());

    let q = JobQueue::new(&JobQueueSettings::default().max_queued_jobs(largest)).unwrap();
    let held: Vec<_> = (0..3).map(|_| q.try_acquire().expect("free")).collect();
    assert_eq!((q.pressure().in_use, q.pressure().max), (3, largest));
    drop(held);
    assert_eq!(q.pressure().in_use, 0);
    assert!(q.try_acquire().is_some());
}
