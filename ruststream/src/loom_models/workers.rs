//! `workers(n)`: the loop's hand-off through mailboxes of one and the
//! idle stack (RT-3).

use std::sync::Arc;

use loom::future::block_on;
use loom::sync::Mutex;
use loom::thread;

use super::check_bounded;
use crate::exec::workers::{Alive, Pool};

/// Every delivery reaches exactly one worker, none is handed to a worker
/// whose mailbox is full (the hand-off asserts it), no wake-up is lost in
/// either direction, and closing ends the workers. Three threads: a
/// preemption bound of 2 keeps it to seconds.
#[test]
fn every_delivery_reaches_one_idle_worker() {
    check_bounded(2, || {
        const WORKERS: usize = 2;
        const ITEMS: u32 = 2;
        let pool = Arc::new(Pool::<u32>::new(WORKERS));
        let got = Arc::new(Mutex::new(Vec::new()));
        let workers: Vec<_> = (0..WORKERS)
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
            for item in 0..ITEMS {
                let id = match reserved.take() {
                    Some(id) => id,
                    None => pool.idle().await.expect("workers are alive"),
                };
                reserved = pool.hand(id, item);
            }
            pool.close();
        });
        for worker in workers {
            worker.join().unwrap();
        }
        let mut got = got.lock().unwrap().clone();
        got.sort_unstable();
        assert_eq!(got, (0..ITEMS).collect::<Vec<_>>());
    });
}
