#[ruststream::app(threads = 4)]
async fn main() {}
