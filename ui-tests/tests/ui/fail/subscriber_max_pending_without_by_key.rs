use ruststream::prelude::*;

#[subscriber("jobs", workers(2), max_pending = 10)]
async fn pending(_job: String) {}

fn main() {}
