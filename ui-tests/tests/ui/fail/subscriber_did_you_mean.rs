//! Misspelled arguments get the one that was meant.
use ruststream::prelude::*;

#[subscriber("jobs", worker(4))]
async fn pooled(job: String) {
    let _ = job;
}

#[subscriber("jobs", deadletter = "jobs.dead")]
async fn dead_lettered(job: String) {
    let _ = job;
}

fn main() {}
