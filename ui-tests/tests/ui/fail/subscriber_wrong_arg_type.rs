use ruststream::prelude::*;

#[subscriber("orders.created", queue_group = billing)]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
