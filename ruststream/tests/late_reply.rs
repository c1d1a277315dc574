//! JQ-24 item 17: a failure after a call completed does not change the
//! caller's result; it only shows in observation. Alone in its test binary:
//! it reads a process-global counter no other test may move.

mod common;

use std::time::Duration;

use common::{Gate, counter, install_metrics, until, within};
use ruststream::prelude::*;
use ruststream::{Error, metrics};
use tokio::sync::Notify;

static SLOW_GATE: Gate = Gate::new();
static REPLIED: Notify = Notify::const_new();

#[subscriber("late.svc")]
async fn slow_service(n: u64, ctx: Ctx) -> u64 {
    SLOW_GATE.pass().await;
    // Runs after the reply is published and the delivery acked.
    ctx.and_after(async { REPLIED.notify_one() });
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jq24_17_a_late_reply_is_observed_and_changes_no_result() {
    install_metrics();
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(slow_service)
        .start()
        .await
        .unwrap();
    let client = Publisher::new(broker.clone());
    let result = client
        .request::<_, u64>("late.svc", &7, Duration::from_millis(100))
        .await;
    assert!(matches!(result, Err(Error::Timeout(_))), "{result:?}");

    // The service answers after the caller gave up: its own publish
    // succeeds, the caller's result stays the timeout, and the late reply
    // is counted.
    SLOW_GATE.open();
    within(5, "the service's reply and ack", REPLIED.notified()).await;
    until(5, "the late reply is counted", || {
        counter(metrics::LATE_REPLIES, "binding", "memory") == 1
    })
    .await;
    assert!(matches!(result, Err(Error::Timeout(_))));
    let handlers_failed = counter(metrics::HANDLER_ERRORS, "subject", "late.svc");
    assert_eq!(handlers_failed, 0, "the service saw no failure either");
    running.shutdown().await.unwrap();
}
