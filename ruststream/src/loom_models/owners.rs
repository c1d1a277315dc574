//! `workers(n, by_key)`: owner FIFOs, held records and the ready-owner set.

use std::future::poll_fn;
use std::sync::Arc;

use loom::future::block_on;
use loom::sync::Mutex;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

use super::check;
use crate::exec::owners::{Admitted, OwnerLimits, OwnerSet};

/// Two workers take turns while the receive loop admits `records` (key,
/// number) with a per-key limit of `per_key`: a key never runs on two
/// workers at once, its records run in arrival order, every record runs
/// once, no wake-up is lost (a lost one deadlocks), and closing ends the
/// workers.
fn turns(per_key: usize, records: &'static [(u64, u32)]) {
    let owners = Arc::new(OwnerSet::<(u64, u32), ()>::new(OwnerLimits {
        max_count: per_key,
        max_bytes: usize::MAX,
        max_total: records.len(),
    }));
    let running = Arc::new([AtomicBool::new(false), AtomicBool::new(false)]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let owners = Arc::clone(&owners);
            let running = Arc::clone(&running);
            let log = Arc::clone(&log);
            thread::spawn(move || {
                block_on(async {
                    // As a `by_key` worker: the next turn at hand in the
                    // lock that ends one, else a wait.
                    let mut wait = owners.waiter();
                    let mut next = poll_fn(|cx| wait.poll(cx)).await;
                    while let Some(turn) = next {
                        let (key, n) = turn.item;
                        let busy = &running[key as usize];
                        assert!(
                            !busy.swap(true, Ordering::SeqCst),
                            "key {key} twice at once"
                        );
                        log.lock().unwrap().push((key, n));
                        busy.store(false, Ordering::SeqCst);
                        next = match owners.finish_and_next(turn.owner, turn.bytes) {
                            Some(turn) => Some(turn),
                            None => poll_fn(|cx| wait.poll(cx)).await,
                        };
                    }
                })
            })
        })
        .collect();
    block_on(async {
        for &(key, n) in records {
            // The receive loop: held records with room first (JQ-5).
            while owners.has_promotable() {
                let _ = owners.promote(());
            }
            assert!(owners.wait_capacity().await);
            match owners.admit(key, (key, n), (), 1) {
                Ok((Admitted::Queued | Admitted::Held(()), _)) => {}
                Err(_) => unreachable!("open"),
            }
        }
        owners.close();
    });
    for worker in workers {
        worker.join().unwrap();
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), records.len(), "every record once: {log:?}");
    for key in [0, 1] {
        let ran: Vec<u32> = log
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, n)| *n)
            .collect();
        let sent: Vec<u32> = records
            .iter()
            .filter(|(k, _)| *k == key)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(ran, sent, "key {key} in arrival order: {log:?}");
    }
}

/// A key at its limit of 1 holds its next records, which are promoted in
/// order while the other worker is free to take them.
#[test]
fn held_records_of_a_key_run_in_order_and_one_at_a_time() {
    check(|| turns(1, &[(0, 0), (0, 1), (0, 2)]));
}

/// A key with a queued record goes back to the ready set when its turn
/// ends, beside another key.
#[test]
fn a_key_with_more_work_is_ready_again_after_its_turn() {
    check(|| turns(2, &[(0, 0), (0, 1), (1, 0)]));
}
