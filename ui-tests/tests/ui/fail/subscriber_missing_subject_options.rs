use ruststream::prelude::*;

#[subscriber(max_attempts = 3)]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
