use ruststream::prelude::*;

/// Neither `std::error::Error` nor `Serialize`.
struct Rejected;

#[subscriber("orders.created")]
async fn confirm(order: String) -> Result<(), Rejected> {
    let _ = order;
    Err(Rejected)
}

fn main() {}
