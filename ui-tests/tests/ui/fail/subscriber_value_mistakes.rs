//! Mistakes in option values, all reported at once: a codec that is not a
//! type, a negative count, and a batch with an unknown key, a repeated
//! `max` and a bad `wait`; a negative worker count beside an unknown
//! `workers(..)` argument.
use ruststream::prelude::*;

#[subscriber("jobs", codec = 5, max_attempts = -1, batch(size = 1, max = 10, max = 20, wait = "5xs"))]
async fn jobs(job: Vec<String>) {
    let _ = job;
}

#[subscriber("jobs", workers(-2, ordered))]
async fn ordered(job: String) {
    let _ = job;
}

fn main() {}
