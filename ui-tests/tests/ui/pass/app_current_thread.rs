#[ruststream::app(flavor = "current_thread")]
async fn main() {}
