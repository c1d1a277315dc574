use ruststream::prelude::*;

#[subscriber("orders.created")]
fn confirm(order: String) {
    let _ = order;
}

fn main() {}
