use ruststream::prelude::*;

#[subscriber("orders.created")]
async fn confirm(order: String) -> &'static str {
    let _ = order;
    "ok"
}

fn main() {}
