use ruststream::prelude::*;

#[subscriber("orders.created")]
async fn only_ctx(ctx: Ctx) {
    let _ = ctx;
}

#[subscriber("orders.deleted")]
async fn no_args() {}

fn main() {}
