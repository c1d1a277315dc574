//! CBOR through `ciborium` (feature `cbor`).

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Codec, Decode, Encode};
use crate::BoxError;

/// CBOR (RFC 8949) for `serde` types. Content type `application/cbor`.
///
/// ```
/// use ruststream::codec::{Cbor, Decode, Encode};
///
/// let bytes = Cbor::encode(&vec![1u8, 2, 3]).unwrap();
/// let back: Vec<u8> = Cbor::decode(&bytes).unwrap();
/// assert_eq!(back, [1, 2, 3]);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Cbor;

impl Codec for Cbor {
    const CONTENT_TYPE: &'static str = "application/cbor";
}

impl<T: DeserializeOwned> Decode<T> for Cbor {
    fn decode(payload: &Bytes) -> Result<T, BoxError> {
        Ok(ciborium::from_reader(&payload[..])?)
    }
}

impl<T: Serialize + ?Sized> Encode<T> for Cbor {
    fn encode(value: &T) -> Result<Bytes, BoxError> {
        Ok(super::encode_with_scratch(|buf| {
            ciborium::into_writer(value, buf)
        })?)
    }
}
