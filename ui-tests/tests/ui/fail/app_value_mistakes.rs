//! Mistakes in `#[ruststream::app]` values, all reported at once, each
//! saying what its argument takes.
#[ruststream::app(threads = 2, shutdown_timeout = 30, worker_threads = 2.5, flavor = current_thread)]
async fn main() {}
