use ruststream::prelude::*;

#[subscriber("orders.created")]
async fn confirm<T: serde::de::DeserializeOwned>(order: T) {
    let _ = order;
}

fn main() {}
