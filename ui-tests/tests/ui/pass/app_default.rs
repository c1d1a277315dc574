//! `#[ruststream::app]` with no arguments: a multi-thread runtime.
#[ruststream::app]
async fn main() {
    let answer = async { 42 }.await;
    assert_eq!(answer, 42);
}
