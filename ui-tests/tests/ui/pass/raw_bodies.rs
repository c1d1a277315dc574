//! Raw bodies bypass the codec: `Bytes`, `String`, `Vec<u8>`.
use ruststream::prelude::*;

#[subscriber("raw.bytes")]
async fn bytes_body(payload: Bytes) {
    let _ = payload.len();
}

#[subscriber("raw.bytes.full_path")]
async fn bytes_full_path(payload: ruststream::bytes::Bytes) {
    let _ = payload.len();
}

#[subscriber("raw.string")]
async fn string_body(text: String, ctx: Ctx) {
    let _ = (text.len(), ctx.payload());
}

#[subscriber("raw.vec")]
async fn vec_body(data: Vec<u8>) {
    let _ = data.len();
}

fn main() {
    let _app = App::new()
        .broker(MemoryBroker::new())
        .subscriber(bytes_body)
        .subscriber(bytes_full_path)
        .subscriber(string_body)
        .subscriber(vec_body);
}
