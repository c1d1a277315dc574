use ruststream::prelude::*;

// Every batch mistake in one file: each is reported on its own span.

#[subscriber("a", batch(max = 10))]
async fn not_a_vec(_order: u32) {}

#[subscriber("b", batch(max = 10))]
async fn replies(orders: Vec<u32>) -> u32 {
    orders.len() as u32
}

#[subscriber("c", batch(max = 10, wait = "5 minutes"))]
async fn bad_wait(_orders: Vec<u32>) {}

#[subscriber("d", batch(max = 0))]
async fn zero(_orders: Vec<u32>) {}

#[subscriber("e", batch(wait = "5ms"))]
async fn no_max(_orders: Vec<u32>) {}

#[subscriber("f", batch(max = 10, size = 3))]
async fn unknown_key(_orders: Vec<u32>) {}

#[subscriber("g", batch(max = 10), workers(4))]
async fn with_workers(_orders: Vec<u32>) {}

fn main() {}
