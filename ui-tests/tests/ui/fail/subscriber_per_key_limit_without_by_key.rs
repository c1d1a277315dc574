use ruststream::prelude::*;

#[subscriber("jobs", workers(2), max_pending_per_key = 4)]
async fn job(body: String) {
    let _ = body;
}

fn main() {}
