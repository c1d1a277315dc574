//! `workers(n)`: the loop's hand-off through mailboxes of one and the
//! idle stack.

use std::sync::Arc;

use loom::future::block_on;
use loom::sync::Mutex;
use loom::thread;

use super::{check, check_bounded};
use crate::exec::workers::{Alive, Pool};

/// The loop and `workers` workers hand `items` deliveries over: every
/// delivery reaches exactly one worker, none is handed to a worker whose
/// mailbox is full (the hand-off asserts it), no wake-up is lost in either
/// direction (a lost one deadlocks), and closing ends the workers.
fn hand_over(workers: usize, items: u32) {
    let pool = Arc::new(Pool::<u32>::new(workers));
    let got = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..workers)
        .map(|id| {
            let pool = Arc::clone(&pool);
            let got = Arc::clone(&got);
            thread::spawn(move || {
                block_on(async {
                    let _alive = Alive(&pool);
                    while let Some(item) = pool.recv(id).await {
                        got.lock().unwrap().push(item);
                    }
                })
            })
        })
        .collect();
    block_on(async {
        let mut reserved = None;
        for item in 0..items {
            let id = match reserved.take() {
                Some(id) => id,
                None => pool.idle().await.expect("workers are alive"),
            };
            reserved = pool.hand(id, item);
        }
        pool.close();
    });
    for thread in threads {
        thread.join().unwrap();
    }
    let mut got = got.lock().unwrap().clone();
    got.sort_unstable();
    assert_eq!(got, (0..items).collect::<Vec<_>>());
}

/// Two workers: a hand-off reserves the other idle worker for the next
/// delivery. Three threads: a preemption bound of 2 keeps it to seconds.
#[test]
fn a_hand_off_reserves_the_next_idle_worker() {
    check_bounded(2, || hand_over(2, 2));
}

/// One worker, three deliveries: it lists itself idle again after each.
#[test]
fn a_worker_lists_itself_idle_after_each_delivery() {
    check(|| hand_over(1, 3));
}
