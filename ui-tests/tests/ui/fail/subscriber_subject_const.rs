use ruststream::prelude::*;

const SUBJECT: &str = "orders.created";

#[subscriber(SUBJECT)]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {
    let _ = SUBJECT;
}
