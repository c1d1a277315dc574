#[ruststream::app(flavor = "single_thread")]
async fn main() {}
