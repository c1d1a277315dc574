use ruststream::prelude::*;

#[subscriber("orders.created")]
async fn confirm(order: &'static str) {
    let _ = order;
}

fn main() {}
