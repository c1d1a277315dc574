//! An annotated function keeps its name and stays callable and awaitable.
use ruststream::HandlerError;
use ruststream::prelude::*;

#[derive(Deserialize)]
struct Order {
    id: u64,
}

#[derive(Serialize, Debug, PartialEq)]
struct Confirmed {
    id: u64,
}

#[subscriber("orders.created")]
async fn confirm(order: Order) -> Result<Confirmed, HandlerError> {
    Ok(Confirmed { id: order.id })
}

#[subscriber("orders.destructured")]
async fn double(Order { id }: Order) -> u64 {
    id * 2
}

#[ruststream::app(flavor = "current_thread")]
async fn main() {
    let confirmed = confirm(Order { id: 7 }).await.unwrap();
    assert_eq!(confirmed, Confirmed { id: 7 });
    assert_eq!(double(Order { id: 21 }).await, 42);

    // The same function is still a subscriber.
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(confirm)
        .start()
        .await
        .unwrap();
    running.shutdown().await.unwrap();
}
