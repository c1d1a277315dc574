#[ruststream::app]
async fn main() -> i32 {
    0
}
