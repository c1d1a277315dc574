//! `worker_threads` alone implies the default multi-thread flavor.
#[ruststream::app(worker_threads = 1)]
async fn main() {}
