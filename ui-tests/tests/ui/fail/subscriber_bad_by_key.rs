use ruststream::prelude::*;

#[subscriber("jobs", workers(2, by_key = "tenant"))]
async fn literal_key(_job: String) {}

#[subscriber("jobs", workers(2, ordered))]
async fn unknown_option(_job: String) {}

#[subscriber("jobs", workers("two"))]
async fn count_not_a_number(_job: String) {}

fn main() {}
