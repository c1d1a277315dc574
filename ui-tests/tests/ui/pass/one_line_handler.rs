//! A one-line handler whose body is a struct expression gets no
//! `unused_braces` warning (denied here).
#![deny(unused_braces)]
use ruststream::prelude::*;

#[derive(Deserialize)]
struct Order {
    id: u64,
}

#[derive(Serialize)]
struct Receipt {
    id: u64,
}

#[subscriber("orders")]
async fn receipt(order: Order) -> Receipt { Receipt { id: order.id } }

fn main() {
    let _app = App::new().broker(MemoryBroker::new()).subscriber(receipt);
}
