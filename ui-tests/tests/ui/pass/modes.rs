use std::rc::Rc;

use ruststream::prelude::*;

#[derive(Serialize, Deserialize)]
struct Payment {
    account: u64,
    cents: u64,
}

fn account(p: &Payment) -> u64 {
    p.account
}

#[subscriber("a", workers(4))]
async fn pooled(_p: Payment) {}

#[subscriber("b", workers(8, by_key))]
async fn by_delivery_key(_p: Payment) {}

#[subscriber("c", workers(8, by_key = account), max_pending = 256)]
async fn by_body_key(p: Payment) -> u64 {
    p.cents
}

#[subscriber("d", threads(2))]
async fn on_threads(_p: Payment, ctx: Ctx<MainRuntime>) {
    // `!Send` state across an await compiles on dedicated threads.
    let counter = Rc::new(1u32);
    tokio_yield().await;
    ctx.spawn(async {});
    let _ = *counter;
}

#[subscriber("e", threads(2, by_key = account))]
async fn threads_by_key(_p: Payment) {}

async fn tokio_yield() {}

fn main() {
    let _app = App::new()
        .broker(MemoryBroker::new())
        .subscriber(pooled)
        .subscriber(by_delivery_key)
        .subscriber(by_body_key)
        .subscriber(on_threads)
        .subscriber(threads_by_key);
}
