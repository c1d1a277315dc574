//! What a handler produced: the vocabulary between handlers, middleware and
//! the pipeline that settles deliveries.

use bytes::Bytes;

use crate::HandlerError;

/// What a handler produced.
#[derive(Debug)]
pub enum Outcome {
    /// Success, with the encoded reply if the handler returned a value.
    Ack(Option<Bytes>),
    /// Failure; the error decides between redelivery and rejection.
    Failed(HandlerError),
}
