use ruststream::prelude::*;
use ruststream::extract::Subject;

// A batch handler's extractors read the app: `Subject` is one delivery's.
#[subscriber("orders", batch(max = 10))]
async fn per_delivery(_orders: Vec<u32>, _subject: Subject) {}

fn main() {}
