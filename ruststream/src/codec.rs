//! Codecs turn payload bytes into handler bodies and reply values into bytes.
//!
//! JSON ([`Json`]) is the default. Bodies and replies of type `Bytes`, `String`
//! or `Vec<u8>` bypass the codec: the payload passes through as it is.

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::BoxError;

/// A payload format.
///
/// ```
/// use ruststream::{Codec, Json};
///
/// let bytes = Json::encode(&vec![1, 2, 3]).unwrap();
/// assert_eq!(&bytes[..], b"[1,2,3]");
/// let back: Vec<u32> = Json::decode(&bytes).unwrap();
/// assert_eq!(back, [1, 2, 3]);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a codec",
    label = "the `codec` argument must name a type implementing `ruststream::Codec`",
    note = "use `ruststream::Json` (the default) or implement `ruststream::Codec`"
)]
pub trait Codec: Send + Sync + 'static {
    /// MIME type, for brokers that carry one.
    const CONTENT_TYPE: &'static str;

    /// Decodes a payload. An error marks the message malformed: it never
    /// reaches the handler.
    fn decode<T: DeserializeOwned>(payload: &Bytes) -> Result<T, BoxError>;

    /// Encodes a value.
    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, BoxError>;
}

/// Encoded values up to this size take the one-allocation path.
const SMALL: usize = 256;

/// JSON through `serde_json`: the default codec.
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

impl Codec for Json {
    const CONTENT_TYPE: &'static str = "application/json";

    #[inline]
    fn decode<T: DeserializeOwned>(payload: &Bytes) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(payload)?)
    }

    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Bytes, BoxError> {
        // A small value is written on the stack and copied out at its exact
        // size: one allocation, where a growing `Vec` handed to `Bytes` costs
        // two (the buffer, then `Bytes`' header for its spare capacity).
        let mut buf = [0u8; SMALL];
        let mut rest = &mut buf[..];
        match serde_json::to_writer(&mut rest, value) {
            Ok(()) => {
                let len = SMALL - rest.len();
                Ok(Bytes::copy_from_slice(&buf[..len]))
            }
            // Too big for the stack buffer: the ordinary way.
            Err(err) if err.is_io() => Ok(Bytes::from(serde_json::to_vec(value)?)),
            Err(err) => Err(err.into()),
        }
    }
}
