//! Arguments may be patterns: destructuring, `mut`, `_`.
use ruststream::prelude::*;

#[derive(Deserialize)]
struct Order {
    id: u64,
    qty: u32,
}

#[derive(Deserialize)]
struct Pair(u64, u64);

#[subscriber("orders.destructured")]
async fn destructured(Order { id, qty }: Order) -> u64 {
    id * u64::from(qty)
}

#[subscriber("pairs")]
async fn tuple_struct(Pair(a, b): Pair, _: Ctx) -> u64 {
    a + b
}

#[subscriber("orders.mut")]
async fn mutable(mut order: Order, mut ctx: Ctx) -> u32 {
    order.qty += 1;
    ctx = ctx.clone();
    let _ = ctx.attempt();
    order.qty
}

#[subscriber("ignored")]
async fn ignored(_: Bytes) {}

fn main() {
    let _app = App::new()
        .broker(MemoryBroker::new())
        .subscriber(destructured)
        .subscriber(tuple_struct)
        .subscriber(mutable)
        .subscriber(ignored);
}
