use ruststream::prelude::*;

// `String` is `Serialize` but not an error: the `Err` must not be taken for a
// reply value.
#[subscriber("orders.created")]
async fn confirm(order: String) -> Result<u32, String> {
    Err(order)
}

fn main() {}
