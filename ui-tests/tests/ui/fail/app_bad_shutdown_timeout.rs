#[ruststream::app(shutdown_timeout = "30 seconds")]
async fn main() {}
