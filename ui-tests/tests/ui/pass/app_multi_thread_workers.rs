#[ruststream::app(flavor = "multi_thread", worker_threads = 2)]
async fn main() {}
