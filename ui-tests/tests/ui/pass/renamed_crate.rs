//! `crate = "..."` for a renamed dependency: the generated code goes
//! through that path instead of `::ruststream`.
use ::ruststream as streams;
use streams::prelude::*;

#[subscriber("orders", crate = "crate::streams")]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {
    let _app = App::new().broker(MemoryBroker::new()).subscriber(confirm);
}
