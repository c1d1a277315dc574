//! A literal of the wrong kind says what the argument takes.
use ruststream::prelude::*;

#[subscriber("orders.created", queue_group = 5, max_attempts = "3", receive_flow = "yes")]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
