use ruststream::prelude::*;

#[subscriber("uploads", max_message_size = 0)]
async fn upload(body: Bytes) {
    let _ = body;
}

fn main() {}
