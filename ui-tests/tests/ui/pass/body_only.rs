//! The body alone: a `Deserialize` type decoded with the default codec.
use ruststream::prelude::*;

#[derive(Deserialize)]
struct Order {
    id: u64,
}

#[subscriber("orders.created")]
async fn confirm(order: Order) {
    let _ = order.id;
}

fn main() {
    let _app = App::new().broker(MemoryBroker::new()).subscriber(confirm);
}
