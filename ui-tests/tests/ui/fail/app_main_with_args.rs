#[ruststream::app]
async fn main(args: Vec<String>) {
    let _ = args;
}
