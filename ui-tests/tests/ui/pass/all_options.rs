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

fn main() {
    let config = ruststream::Subscriber::config(&confirm {});
    assert_eq!(config.subject(), "orders.created");
    assert_eq!(config.get_max_attempts(), 5);
    let _app = App::new()
        .broker(MemoryBroker::new())
        .subscriber(confirm)
        .subscriber(update)
        .subscriber(delete);
}
