//! Every option of `#[subscriber]`, in any order after the subject.
use ruststream::prelude::*;

#[derive(Deserialize)]
struct Order {
    id: u64,
}

#[subscriber(
    "orders.created",
    queue_group = "billing",
    dead_letter = "orders.dead",
    max_attempts = 5,
    codec = ruststream::Json,
)]
async fn confirm(order: Order) {
    let _ = order.id;
}

#[subscriber("orders.updated", codec = ruststream::Json, max_attempts = 1, queue_group = "q")]
async fn update(order: Order) {
    let _ = order.id;
}

#[ruststream::subscriber("orders.deleted", dead_letter = "orders.dead")]
async fn delete(order: Order) {
    let _ = order.id;
}

#[subscriber(
    "orders.audit",
    queue_group = "audit",
    receive_flow = false,
    workers(4, by_key),
    max_pending = 64,
    max_pending_per_key = 8,
    max_pending_bytes_per_key = 1048576,
    fail_fast,
)]
async fn audit(order: Order) {
    let _ = order.id;
}

fn main() {
    let config = ruststream::subscriber::Subscriber::config(&confirm {});
    assert_eq!(config.subject(), "orders.created");
    assert_eq!(config.retry_budget(), 5);
    assert!(config.pausable(), "queue-group subscribers are request/reply sources");
    assert!(!ruststream::subscriber::Subscriber::config(&audit {}).pausable());
    assert!(!ruststream::subscriber::Subscriber::config(&delete {}).pausable());
    let _app = App::new()
        .broker(MemoryBroker::new())
        .subscriber(confirm)
        .subscriber(update)
        .subscriber(delete)
        .subscriber(audit);
}
