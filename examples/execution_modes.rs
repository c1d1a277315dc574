//! Execution modes: one subscriber per mode on the memory broker.
//!
//! Run it with `cargo run --example execution_modes`. Each subscriber handles
//! a batch of payments; the program prints where each mode ran its handlers
//! and exits 0 once all of them are done.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ruststream::prelude::*;
use tokio::sync::Notify;

#[derive(Debug, Serialize, Deserialize)]
struct Payment {
    account: u32,
    seq: u32,
    cents: u64,
}

const ACCOUNTS: u32 = 8;
const PER_ACCOUNT: u32 = 25;
const TOTAL: u32 = ACCOUNTS * PER_ACCOUNT;

static DONE: AtomicU32 = AtomicU32::new(0);
static ALL_DONE: Notify = Notify::const_new();

fn done() {
    // Four subscribers each see every payment.
    if DONE.fetch_add(1, Ordering::SeqCst) + 1 == 4 * TOTAL {
        ALL_DONE.notify_one();
    }
}

/// Default mode: one payment at a time, in publish order (RT-2).
#[subscriber("payments", queue_group = "audit")]
async fn audit(p: Payment) {
    let _ = p.cents;
    done();
}

/// `workers(4)`: up to four payments in flight on the app runtime (RT-3).
/// Order across payments is not kept.
#[subscriber("payments", queue_group = "fraud", workers(4))]
async fn fraud_check(p: Payment) {
    tokio::task::yield_now().await; // stands for an async call
    let _ = p.account;
    done();
}

/// The key of a payment: its account.
fn account(p: &Payment) -> u32 {
    p.account
}

static LAST_SEQ: Mutex<Option<HashMap<u32, u32>>> = Mutex::new(None);

/// `workers(4, by_key = account)`: payments of one account run one at a time,
/// in arrival order; different accounts run in parallel (RT-4).
#[subscriber("payments", queue_group = "ledger", workers(4, by_key = account))]
async fn ledger(p: Payment) -> Result<(), HandlerError> {
    {
        let mut last = LAST_SEQ.lock().unwrap();
        let last = last.get_or_insert_with(HashMap::new);
        if let Some(previous) = last.insert(p.account, p.seq) {
            assert_eq!(previous + 1, p.seq, "per-account order");
        }
    }
    tokio::task::yield_now().await;
    done();
    Ok(())
}

thread_local! {
    /// `!Send` per-thread state: fine in `threads(n)` handlers.
    static SEEN_ON_THIS_THREAD: RefCell<u32> = const { RefCell::new(0) };
}

/// `threads(2)`: two OS threads with their own current-thread runtimes (RT-5).
/// The handler may hold `!Send` values (here an `Rc`) across `.await`.
/// `Ctx<MainRuntime>` hands `Send` work back to the app runtime, tracked by
/// the app (RT-6); a plain `tokio::spawn` here would run on this thread's
/// runtime, untracked, and end with the thread (RT-11).
#[subscriber("payments", queue_group = "reports", threads(2))]
async fn report(p: Payment, ctx: Ctx<MainRuntime>) {
    let local = Rc::new(p.cents);
    tokio::task::yield_now().await;
    SEEN_ON_THIS_THREAD.with(|n| *n.borrow_mut() += 1);
    let cents = *local;
    ctx.spawn(async move {
        let _ = cents; // e.g. write to a client owned by the app runtime
        done();
    });
}

#[ruststream::app]
async fn main() -> ruststream::Result<()> {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(audit)
        .subscriber(fraud_check)
        .subscriber(ledger)
        .subscriber(report)
        .start()
        .await?;

    let client = Publisher::new(broker.clone());
    for seq in 0..PER_ACCOUNT {
        for account in 0..ACCOUNTS {
            let payment = Payment {
                account,
                seq,
                cents: 100 + u64::from(seq),
            };
            client.publish("payments", &payment).await?;
        }
    }
    tokio::time::timeout(Duration::from_secs(10), ALL_DONE.notified())
        .await
        .map_err(|_| ruststream::Error::Timeout(Duration::from_secs(10)))?;
    running.shutdown().await?;
    println!("{} payments handled in four modes", TOTAL);
    Ok(())
}
