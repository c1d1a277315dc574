//! Every accepted return type.
use ruststream::HandlerError;
use ruststream::prelude::*;

#[derive(Deserialize)]
struct Order {
    id: u64,
}

#[derive(Serialize)]
struct Confirmed {
    id: u64,
}

#[subscriber("unit")]
async fn unit(_order: Order) {}

#[subscriber("unit.explicit")]
async fn unit_explicit(_order: Order) -> () {}

#[subscriber("reply")]
async fn reply(order: Order) -> Confirmed {
    Confirmed { id: order.id }
}

#[subscriber("reply.string")]
async fn reply_string(order: Order) -> String {
    order.id.to_string()
}

#[subscriber("reply.bytes")]
async fn reply_bytes(order: Order) -> Bytes {
    Bytes::from(order.id.to_string())
}

#[subscriber("reply.vec")]
async fn reply_vec(order: Order) -> Vec<u8> {
    order.id.to_be_bytes().to_vec()
}

#[subscriber("result")]
async fn result(order: Order) -> Result<Confirmed, HandlerError> {
    if order.id == 0 {
        return Err(HandlerError::reject("an order needs an id"));
    }
    Ok(Confirmed { id: order.id })
}

#[subscriber("result.unit")]
async fn result_unit(_order: Order) -> Result<(), HandlerError> {
    Err(HandlerError::retry("not yet"))
}

#[subscriber("result.io")]
async fn result_io(_order: Order) -> Result<(), std::io::Error> {
    Err(std::io::Error::other("disk full"))
}

#[subscriber("result.io.question_mark")]
async fn result_io_question_mark(payload: String) -> Result<String, std::io::Error> {
    let n: u64 = payload.trim().parse().map_err(std::io::Error::other)?;
    Ok((n + 1).to_string())
}

#[subscriber("result.ruststream")]
async fn result_ruststream(_order: Order) -> ruststream::Result<(), HandlerError> {
    Ok(())
}

fn main() {
    let _app = App::new()
        .broker(MemoryBroker::new())
        .subscriber(unit)
        .subscriber(unit_explicit)
        .subscriber(reply)
        .subscriber(reply_string)
        .subscriber(reply_bytes)
        .subscriber(reply_vec)
        .subscriber(result)
        .subscriber(result_unit)
        .subscriber(result_io)
        .subscriber(result_io_question_mark)
        .subscriber(result_ruststream);
}
