use ruststream::prelude::*;

#[subscriber("orders.created", codec = String)]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
