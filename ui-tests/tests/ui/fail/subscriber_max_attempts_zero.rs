use ruststream::prelude::*;

#[subscriber("orders.created", max_attempts = 0)]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
