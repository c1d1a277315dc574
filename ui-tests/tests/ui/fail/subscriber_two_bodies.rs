use ruststream::prelude::*;

#[derive(Deserialize)]
struct Order {
    id: u64,
}

#[subscriber("orders.created")]
async fn confirm(order: Order, subject: String) {
    let _ = (order.id, subject);
}

fn main() {}
