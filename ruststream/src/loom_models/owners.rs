//! `workers(n, by_key)`: owner FIFOs, held records and the ready-owner set
//! (RT-4, JQ-5, JQ-9, JQ-10).

use std::future::poll_fn;
use std::sync::Arc;

use loom::future::block_on;
use loom::sync::Mutex;
use loom::sync::atomic::{AtomicBool, Ordering};
use loom::thread;

use super::check;
use crate::exec::owners::{Admitted, OwnerLimits, OwnerSet};

/// Two workers take turns while the receive loop admits three records of
/// two keys with a per-key limit of 1 (so one is held and promoted): a key
/// never runs on two workers at once, its records run in arrival order,
/// every record runs once, no wake-up is lost (a lost one deadlocks), and
/// closing ends the workers.
#[test]
fn one_turn_per_key_in_order_with_held_records() {
    check(|| {
        let owners = Arc::new(OwnerSet::<(u64, u32), ()>::new(OwnerLimits {
            max_count: 1,
            max_bytes: usize::MAX,
            max_total: 3,
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
                        let mut wait = owners.waiter();
                        while let Some(turn) = poll_fn(|cx| wait.poll(cx)).await {
                            let (key, n) = turn.item;
                            let busy = &running[key as usize];
                            assert!(
                                !busy.swap(true, Ordering::SeqCst),
                                "key {key} twice at once"
                            );
                            log.lock().unwrap().push((key, n));
                            busy.store(false, Ordering::SeqCst);
                            owners.finish(turn.owner, turn.bytes);
                        }
                    })
                })
            })
            .collect();
        block_on(async {
            for (key, n) in [(0, 0), (0, 1), (1, 0)] {
                // The receive loop: held records with room first (JQ-5).
                while owners.has_promotable() {
                    let _ = owners.promote(());
                }
                assert!(owners.wait_capacity().await);
                match owners.admit(key, (key, n), (), 1) {
                    Ok(Admitted::Queued | Admitted::Held(())) => {}
                    Err(_) => unreachable!("open"),
                }
            }
            owners.close();
        });
        for worker in workers {
            worker.join().unwrap();
        }
        let log = log.lock().unwrap().clone();
        assert_eq!(log.len(), 3, "every record once: {log:?}");
        let key0: Vec<u32> = log
            .iter()
            .filter(|(k, _)| *k == 0)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(key0, [0, 1], "in arrival order");
    });
}
