//! Quickstart: a service on the embedded memory broker.
//!
//! Run it with `cargo run --example quickstart`. Once the app is up, a
//! client publishes a handful of orders, a subscriber confirms each one, a
//! request/reply round trip shows the reply path, and the app shuts down
//! gracefully and exits 0. The binary has the command line of every
//! `#[ruststream::app]` (feature `cli`): `cargo run --example quickstart --
//! asyncapi` prints its AsyncAPI document, `-- check` checks its settings,
//! `-- --help` lists the rest.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ruststream::prelude::*;
use ruststream::{AppHandle, BoxError};
use tokio::sync::Notify;

/// `JsonSchema` gives the AsyncAPI document the fields of each message.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Order {
    pub id: u64,
    pub sku: String,
    pub qty: u32,
}

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Confirmed {
    pub id: u64,
    pub total_qty: u32,
}

static HANDLED: AtomicU32 = AtomicU32::new(0);
static ALL_HANDLED: Notify = Notify::const_new();
const ORDERS: u32 = 5;

/// Default mode: one delivery at a time, in publish order. The return value
/// is the reply when the message is a request; for a plain publish it is
/// dropped.
#[subscriber("orders.created", dead_letter = "orders.dead")]
async fn confirm(order: Order, ctx: Ctx) -> Result<Confirmed, HandlerError> {
    if order.qty == 0 {
        // Never valid: dead-letter it at once instead of retrying.
        return Err(HandlerError::reject("an order needs a quantity"));
    }
    println!(
        "confirmed order {} ({} x {}) attempt {}",
        order.id,
        order.qty,
        order.sku,
        ctx.attempt()
    );
    if HANDLED.fetch_add(1, Ordering::SeqCst) + 1 == ORDERS {
        ALL_HANDLED.notify_one();
    }
    Ok(Confirmed {
        id: order.id,
        total_qty: order.qty,
    })
}

/// The service: its subscribers on the broker it is given. `main` runs it
/// on the memory broker; `tests/quickstart.rs` runs it under `TestApp`.
pub fn service<B: Broker>(broker: B) -> App<B> {
    App::new().broker(broker).subscriber(confirm)
}

/// Returning the app gives the binary its command line: `run` (the
/// default), `check`, `asyncapi`, `--config FILE`.
#[ruststream::app]
async fn main() -> ruststream::Result<App<MemoryBroker>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();

    Ok(service(MemoryBroker::new())
        .after_startup(client)
        .after_shutdown(|_| async {
            println!("handled {} orders; bye", HANDLED.load(Ordering::SeqCst));
            Ok(())
        }))
}

/// A client of the running app: sends orders and a request, waits for every
/// confirmation, then asks the app to stop (a graceful shutdown: loops
/// settle what they hold, then the broker closes).
async fn client(app: AppHandle) -> Result<(), BoxError> {
    // Typed sends and requests, JSON-encoded, on the app's broker.
    let client = app
        .publisher::<MemoryBroker>()
        .expect("the app has a memory broker");

    for id in 1..ORDERS as u64 {
        let order = Order {
            id,
            sku: "blue-widget".into(),
            qty: 2,
        };
        client.publish("orders.created", &order).await?;
    }

    // Request/reply: the handler's return value comes back to the caller.
    let order = Order {
        id: 99,
        sku: "red-widget".into(),
        qty: 3,
    };
    let reply: Confirmed = client
        .request("orders.created", &order, Duration::from_secs(2))
        .await?;
    println!("reply: {reply:?}");

    tokio::time::timeout(Duration::from_secs(5), ALL_HANDLED.notified())
        .await
        .map_err(|_| ruststream::Error::Timeout(Duration::from_secs(5)))?;
    app.request_shutdown();
    Ok(())
}
