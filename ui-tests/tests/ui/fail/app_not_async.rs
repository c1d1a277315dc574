#[ruststream::app]
fn main() {}
