use ruststream::prelude::*;

#[subscriber]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {}
