//! `workers(n)`: the subscription the workers share — claimed in place,
//! or taken out by one worker while the others wait for it back.

use std::collections::VecDeque;
use std::pin::pin;
use std::sync::Arc;

use loom::future::block_on;
use loom::sync::Mutex;
use loom::thread;

use super::{check, check_bounded};
use crate::exec::shared_subscription::{Out, Shared};

/// `workers` workers share a "subscription" of `items` records, each
/// taking one record in place and the next with the subscription taken out
/// (as a worker that waits with it), in turns: a take while another worker
/// has it out waits for it back. Every record reaches exactly one worker,
/// and no wake-up is lost when it is given back (a lost one deadlocks).
fn share(workers: usize, items: u32) {
    let shared = Arc::new(Shared::new((0..items).collect::<VecDeque<u32>>()));
    let got = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..workers)
        .map(|_| {
            let shared = Arc::clone(&shared);
            let got = Arc::clone(&got);
            thread::spawn(move || {
                block_on(async {
                    let mut never = pin!(std::future::pending::<()>());
                    loop {
                        match shared.with(VecDeque::pop_front) {
                            Ok(Some(item)) => got.lock().unwrap().push(item),
                            Ok(None) | Err(Out::Closed) => break,
                            Err(Out::Taken) => {}
                        }
                        let Some(mut held) = shared.take(never.as_mut()).await else {
                            break;
                        };
                        match held.pop_front() {
                            Some(item) => got.lock().unwrap().push(item),
                            None => break,
                        }
                    }
                })
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let mut got = got.lock().unwrap().clone();
    got.sort_unstable();
    assert_eq!(got, (0..items).collect::<Vec<_>>());
}

/// Two workers, three records.
#[test]
fn a_worker_waiting_for_the_subscription_is_woken_when_it_is_given_back() {
    check(|| share(2, 3));
}

/// Three workers: a give-back wakes one waiting worker, which takes it or
/// passes it on. A preemption bound of 2 keeps it to seconds.
#[test]
fn three_workers_share_one_subscription() {
    check_bounded(2, || share(3, 2));
}

/// A worker waiting for the subscription while the workers are closed ends
/// its wait.
#[test]
fn closing_ends_a_wait_for_the_subscription() {
    check(|| {
        let shared = Arc::new(Shared::new(()));
        let mut never = pin!(std::future::pending::<()>());
        let held = block_on(shared.take(never.as_mut())).expect("at hand");
        let waiter = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || {
                let mut never = pin!(std::future::pending::<()>());
                block_on(shared.take(never.as_mut())).is_none()
            })
        };
        shared.close();
        drop(held);
        assert!(waiter.join().unwrap(), "a closed set hands out nothing");
    });
}
