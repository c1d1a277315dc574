use ruststream::prelude::*;

#[subscriber("orders.created", queue = "billing")]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
