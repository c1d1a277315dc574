use ruststream::prelude::*;

struct Confirmed {
    id: u64,
}

#[subscriber("orders.created")]
async fn confirm(order: String) -> Confirmed {
    Confirmed {
        id: order.len() as u64,
    }
}

fn main() {}
