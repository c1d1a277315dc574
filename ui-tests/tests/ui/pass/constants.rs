//! Constants (and other expressions) wherever a value goes.
use ruststream::prelude::*;

const ORDERS: &str = "orders.created";
const DEAD: &str = "orders.dead";
const WORKERS: usize = 4;
const ATTEMPTS: u32 = 5;

#[subscriber(ORDERS, workers(WORKERS), dead_letter = DEAD, max_attempts = ATTEMPTS)]
async fn confirm(order: String) {
    let _ = order;
}

fn main() {
    let config = ruststream::subscriber::Subscriber::config(&confirm {});
    assert_eq!(config.subject().as_str(), ORDERS);
    assert_eq!(config.retry_budget(), ATTEMPTS);
    assert_eq!(
        config.mode(),
        ruststream::subscriber::Mode::Workers { n: WORKERS, by_key: false }
    );
}
