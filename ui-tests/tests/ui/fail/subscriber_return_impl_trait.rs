use ruststream::prelude::*;

#[subscriber("orders.created")]
async fn confirm(order: String) -> impl Serialize {
    order
}

fn main() {}
