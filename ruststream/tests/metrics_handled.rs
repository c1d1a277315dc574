//! `ruststream_handled_total` through a recorder of the user's own (the
//! `metrics-util` debugging recorder, counting increments): acks
//! arrive by the end of the shutdown at the latest, the other outcomes
//! at once, each counted once.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};

use common::{counter_with, install_metrics, until, within};
use ruststream::prelude::*;
use ruststream::{SubscribeOptions, metrics};

#[subscriber("recorded.jobs", max_attempts = 2, dead_letter = "recorded.dead")]
async fn job(n: i64) -> Result<(), HandlerError> {
    if n < 0 {
        return Err(HandlerError::retry("negative"));
    }
    Ok(())
}

fn handled(outcome: &str) -> u64 {
    counter_with(
        metrics::HANDLED,
        &[("subject", "recorded.jobs"), ("outcome", outcome)],
    )
}

#[tokio::test]
async fn outcomes_are_counted_once_each() {
    install_metrics();
    let broker = MemoryBroker::new();
    let mut dead = broker
        .subscribe(SubscribeOptions::new("recorded.dead"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(job)
        .start()
        .await
        .unwrap();
    let client = Publisher::new(broker.clone());
    for n in [1, 2, 3, -1] {
        client.publish("recorded.jobs", &n).await.unwrap();
    }
    within(5, "the dead letter", dead.next()).await.unwrap();
    assert_eq!(handled("retried"), 1);
    assert_eq!(handled("dead_lettered"), 1);
    running.shutdown().await.unwrap();
    assert_eq!(handled("acked"), 3);
    assert_eq!(handled("acked"), 3, "a later look adds nothing");
}

static HANDLED: AtomicU32 = AtomicU32::new(0);

#[subscriber("recorded.sequential")]
async fn one_at_a_time(_n: u32) {
    HANDLED.fetch_add(1, Ordering::Relaxed);
}

#[subscriber("recorded.workers", workers(4))]
async fn four_at_a_time(_n: u32) {
    HANDLED.fetch_add(1, Ordering::Relaxed);
}

/// Every ack is counted once whether one loop counts them (the default
/// loop, which counts with a plain load and store, moving between the
/// runtime's threads) or four workers do at once (with a locked add).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_ack_is_counted_once_by_one_loop_or_by_many() {
    install_metrics();
    const N: u32 = 2_000;
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(one_at_a_time)
        .subscriber(four_at_a_time)
        .start()
        .await
        .unwrap();
    let client = Publisher::new(broker.clone());
    for n in 0..N {
        client.publish("recorded.sequential", &n).await.unwrap();
        client.publish("recorded.workers", &n).await.unwrap();
    }
    until(10, "every delivery handled", || {
        HANDLED.load(Ordering::Relaxed) == 2 * N
    })
    .await;
    // The last handler returned; its ack is counted once the shutdown ends.
    running.shutdown().await.unwrap();
    for subject in ["recorded.sequential", "recorded.workers"] {
        let acked = counter_with(
            metrics::HANDLED,
            &[("subject", subject), ("outcome", "acked")],
        );
        assert_eq!(acked, u64::from(N), "{subject}");
    }
}
