use ruststream::prelude::*;

struct Order {
    id: u64,
}

#[subscriber("orders.created")]
async fn confirm(order: Order) {
    let _ = order.id;
}

fn main() {}
