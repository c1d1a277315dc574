use ruststream::prelude::*;

#[subscriber(orders.created)]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
