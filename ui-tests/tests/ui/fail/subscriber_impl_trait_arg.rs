//! An `impl Trait` argument is a generic: one error from the macro, not the
//! compiler's pile.
use ruststream::prelude::*;

#[subscriber("jobs")]
async fn jobs(job: impl serde::de::DeserializeOwned) {
    let _ = job;
}

fn main() {}
