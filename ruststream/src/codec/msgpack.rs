//! MessagePack through `rmp-serde` (feature `msgpack`).

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Codec, Decode, Encode};
use crate::BoxError;

/// MessagePack for `serde` types, struct fields by name (so producers in
/// other languages read them as maps). Content type `application/msgpack`.
///
/// ```
/// use ruststream::codec::{Decode, Encode, MsgPack};
///
/// let bytes = MsgPack::encode(&(7u32, "seven")).unwrap();
/// let back: (u32, String) = MsgPack::decode(&bytes).unwrap();
/// assert_eq!(back, (7, "seven".to_owned()));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct MsgPack;

impl Codec for MsgPack {
    const CONTENT_TYPE: &'static str = "application/msgpack";
}

impl<T: DeserializeOwned> Decode<T> for MsgPack {
    fn decode(payload: &Bytes) -> Result<T, BoxError> {
        Ok(rmp_serde::from_slice(payload)?)
    }
}

impl<T: Serialize + ?Sized> Encode<T> for MsgPack {
    fn encode(value: &T) -> Result<Bytes, BoxError> {
        Ok(super::encode_with_scratch(|buf| {
            rmp_serde::encode::write_named(buf, value)
        })?)
    }
}
