use ruststream::prelude::*;

#[subscriber(queue_group = "billing", "orders.created")]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
