//! Lifecycle: hooks, shared state, follow-up tasks and the ordered shutdown.
//!
//! Run it with `cargo run --example lifecycle`. It prints every lifecycle
//! phase in the order the app runs them, then exits 0.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ruststream::prelude::*;
use tokio::sync::Notify;

/// Shared with every handler and hook through `App::state`.
struct Inventory {
    reserved: AtomicU32,
}

static LOG: Mutex<Vec<String>> = Mutex::new(Vec::new());
static HANDLED: Notify = Notify::const_new();

fn log(event: impl Into<String>) {
    let event = event.into();
    println!("{event}");
    LOG.lock().unwrap().push(event);
}

#[derive(Debug, Serialize, Deserialize)]
struct Order {
    id: u64,
    qty: u32,
}

#[subscriber("orders", workers(2))]
async fn reserve(order: Order, stock: State<Inventory>, ctx: Ctx) {
    stock.reserved.fetch_add(order.qty, Ordering::SeqCst);
    log(format!("handler: reserved order {}", order.id));
    // Runs after the ack, tracked: the shutdown waits for it (RT-8).
    ctx.and_after(async move { log(format!("and_after: order {} confirmed", order.id)) });
    HANDLED.notify_one();
}

#[ruststream::app(shutdown_timeout = "10s")]
async fn main() -> ruststream::Result<()> {
    let broker = MemoryBroker::new();
    let announcements = broker.clone();
    let running = App::new()
        .broker(broker.clone())
        .state(Inventory {
            reserved: AtomicU32::new(0),
        })
        .on_startup(|_app| async {
            log("on_startup: before any subscription opens");
            Ok(())
        })
        .after_startup(|_app| async {
            log("after_startup: every subscriber runs");
            Ok(())
        })
        .on_shutdown(move |_app| async move {
            // Brokers are still connected: a goodbye can still be published.
            announcements
                .publish_message("service.events", Message::new("stopping"), None)
                .await?;
            log("on_shutdown: brokers still connected");
            Ok(())
        })
        .after_shutdown(|app| async move {
            let reserved = app
                .state::<Inventory>()
                .map_or(0, |s| s.reserved.load(Ordering::SeqCst));
            log(format!(
                "after_shutdown: brokers closed; {reserved} items reserved"
            ));
            Ok(())
        })
        .subscriber(reserve)
        .start()
        .await?;

    Publisher::new(broker.clone())
        .publish("orders", &Order { id: 1, qty: 3 })
        .await?;
    tokio::time::timeout(Duration::from_secs(5), HANDLED.notified())
        .await
        .map_err(|_| ruststream::Error::Timeout(Duration::from_secs(5)))?;

    // On a real service `App::run` waits for SIGINT/SIGTERM and then does this.
    running.shutdown().await?;
    let events = LOG.lock().unwrap().len();
    println!("{events} lifecycle events, in order");
    Ok(())
}
