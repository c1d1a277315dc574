//! The context may come before the body.
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
