//! Every error is reported at once, and the function is still a subscriber:
//! no "is not a subscriber" below them.
use ruststream::prelude::*;

#[subscriber("jobs", max_attempts = 0, workers(2), threads(2), colour = "blue")]
async fn broken(job: &str) {
    let _ = job;
}

fn main() {
    let _app = App::new().broker(MemoryBroker::new()).subscriber(broken);
}
