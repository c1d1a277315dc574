//! A new service: one subscriber that confirms orders. It runs on the
//! embedded memory broker; with `NATS_URL` set it runs on NATS instead.

use std::time::Duration;

use ruststream::nats::NatsBroker;
use ruststream::prelude::*;

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u64,
    qty: u32,
}

#[derive(Debug, Serialize, Deserialize)]
struct Confirmed {
    id: u64,
}

#[subscriber("orders.created", queue_group = "orders", dead_letter = "orders.dead")]
async fn confirm(order: Order) -> Result<Confirmed, HandlerError> {
    if order.qty == 0 {
        return Err(HandlerError::reject("an order needs a quantity"));
    }
    Ok(Confirmed { id: order.id })
}

/// Sends one order as a request and prints the confirmation.
async fn try_it<B: Requester>(broker: B) -> ruststream::Result<()> {
    let order = Order { id: 1, qty: 2 };
    let confirmed: Confirmed = Publisher::new(broker)
        .request("orders.created", &order, Duration::from_secs(5))
        .await?;
    println!("confirmed order {}", confirmed.id);
    Ok(())
}

#[ruststream::app]
async fn main() -> ruststream::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    match std::env::var("NATS_URL") {
        Ok(url) => {
            let broker = NatsBroker::connect(&url).await?;
            let running = App::new()
                .broker(broker.clone())
                .subscriber(confirm)
                .start()
                .await?;
            try_it(broker).await?;
            running.shutdown().await
        }
        Err(_) => {
            let broker = MemoryBroker::new();
            let running = App::new()
                .broker(broker.clone())
                .subscriber(confirm)
                .start()
                .await?;
            try_it(broker).await?;
            running.shutdown().await
        }
    }
}
