use ruststream::prelude::*;

struct Service;

impl Service {
    #[subscriber("orders.created")]
    async fn confirm(&self, order: String) {
        let _ = order;
    }
}

fn main() {
    let _ = Service;
}
