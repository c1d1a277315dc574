#[ruststream::app]
async fn main() -> () {}
