use ruststream::prelude::*;

#[subscriber("jobs", workers(2), threads(2))]
async fn both(_job: String) {}

fn main() {}
