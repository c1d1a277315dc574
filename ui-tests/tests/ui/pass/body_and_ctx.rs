//! The body, then the delivery context.
use ruststream::prelude::*;

#[derive(Deserialize)]
struct Order {
    id: u64,
}

#[subscriber("orders.created")]
async fn confirm(order: Order, ctx: Ctx) {
    let _ = (order.id, ctx.attempt(), ctx.subject());
}

// The full path to `Ctx` works as well.
#[subscriber("orders.audited")]
async fn audit(order: Order, ctx: ruststream::Ctx) {
    let _ = (order.id, ctx.headers());
}

fn main() {
    let _app = App::new()
        .broker(MemoryBroker::new())
        .subscriber(confirm)
        .subscriber(audit);
}
