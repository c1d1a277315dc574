//! The body comes first: a `Ctx` in its place is not a message body.
use ruststream::prelude::*;

#[derive(Deserialize)]
struct Order {
    id: u64,
}

#[subscriber("orders.created")]
async fn confirm(ctx: Ctx, order: Order) {
    let _ = (ctx.attempt(), order.id);
}

fn main() {
    let _app = App::new().broker(MemoryBroker::new()).subscriber(confirm);
}
