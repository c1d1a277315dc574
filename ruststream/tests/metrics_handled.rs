//! `ruststream_handled_total` through a recorder of the user's own (the
//! `metrics-util` debugging recorder, counting increments): acks
//! arrive by the end of the shutdown at the latest, the other outcomes
//! at once, each counted once.

mod common;

use common::{counter_with, install_metrics, within};
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
