//! A function call in the subject's place: one error that says what the
//! subject may be, and the options after it are still checked.
use ruststream::prelude::*;

fn subject() -> String {
    "orders".to_owned()
}

#[subscriber(subject(), dead_letter = "")]
async fn confirm(order: String) {
    let _ = (order, subject);
}

fn main() {}
