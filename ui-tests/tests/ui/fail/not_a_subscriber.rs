use ruststream::prelude::*;

async fn confirm(order: String) {
    let _ = order;
}

fn main() {
    let _app = App::new().broker(MemoryBroker::new()).subscriber(confirm);
}
