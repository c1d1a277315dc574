use ruststream::prelude::*;

#[subscriber("orders.created", max_attempts = 1, max_attempts = 2)]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
