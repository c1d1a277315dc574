use ruststream::prelude::*;

#[subscriber("jobs", queue_group = "w", receive_flow = "yes")]
async fn job(body: String) {
    let _ = body;
}

fn main() {}
