use std::rc::Rc;

use ruststream::prelude::*;

async fn tick() {}

#[subscriber("jobs", workers(4))]
async fn holds_rc(job: String) {
    let shared = Rc::new(job);
    tick().await;
    let _ = shared.len();
}

fn main() {}
