use ruststream::prelude::*;

#[subscriber("jobs", workers(0))]
async fn none(_job: String) {}

#[subscriber("jobs", threads(0))]
async fn no_threads(_job: String) {}

fn main() {}
