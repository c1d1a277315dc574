use std::time::Duration;

use ruststream::prelude::*;
use ruststream::{HandlerError, State};

struct Totals;

const MAX: usize = 50;
const WAIT: Duration = Duration::from_millis(2);

#[subscriber("clicks", batch(max = 100, wait = "5ms"))]
async fn clicks(clicks: Vec<u64>) {
    let _ = clicks.len();
}

#[subscriber("orders", batch(max = MAX, wait = WAIT), dead_letter = "orders.dlq")]
async fn orders(orders: Vec<String>, _totals: State<Totals>) -> Result<(), HandlerError> {
    if orders.is_empty() {
        return Err(HandlerError::retry("empty"));
    }
    Ok(())
}

#[subscriber("bytes", batch(max = 10))]
async fn raw(payloads: Vec<Bytes>) -> () {
    let _ = payloads;
}

fn main() {
    let app = App::new()
        .broker(MemoryBroker::new())
        .state(Totals)
        .subscriber(clicks)
        .subscriber(orders)
        .subscriber(raw);
    drop(app);
    // Called directly, a batch handler is a plain function of its records.
    let _future = clicks(vec![1, 2, 3]);
}
