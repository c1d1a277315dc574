//! Codecs turn payload bytes into handler bodies and reply values into bytes.
//!
//! JSON ([`Json`]) is the default. With cargo features: MessagePack
//! ([`MsgPack`], feature `msgpack`), CBOR ([`Cbor`], feature `cbor`) and
//! Protobuf ([`Protobuf`], feature `protobuf`, for `prost` messages). A
//! subscriber picks one with `codec = ..`, a publisher with
//! [`Publisher::with_codec`](crate::Publisher::with_codec).
//!
//! Every message a codec encodes carries its [`Codec::CONTENT_TYPE`] in the
//! `content-type` header. A subscriber that receives another content type
//! treats the message as malformed: it never reaches the handler, it is
//! dead-lettered with the reason, and a request gets an error reply. A
//! message without the header is decoded with the subscriber's codec.
//! Bodies and replies of type `Bytes`, `String` or `Vec<u8>` bypass the
//! codec: the payload passes through as it is, whatever its content type.
//!
//! A codec of one's own is a type implementing [`Codec`], with [`Decode`]
//! and [`Encode`] for the values it handles:
//!
//! ```
//! use bytes::Bytes;
//! use ruststream::BoxError;
//! use ruststream::codec::{Codec, Decode, Encode};
//!
//! /// Plain UTF-8 lines.
//! struct Lines;
//!
//! impl Codec for Lines {
//!     const CONTENT_TYPE: &'static str = "text/plain";
//! }
//!
//! impl Decode<Vec<String>> for Lines {
//!     fn decode(payload: &Bytes) -> Result<Vec<String>, BoxError> {
//!         Ok(std::str::from_utf8(payload)?.lines().map(str::to_owned).collect())
//!     }
//! }
//!
//! impl Encode<Vec<String>> for Lines {
//!     fn encode(value: &Vec<String>) -> Result<Bytes, BoxError> {
//!         Ok(Bytes::from(value.join("\n")))
//!     }
//! }
//!
//! let bytes = Lines::encode(&vec!["a".to_owned(), "b".to_owned()]).unwrap();
//! let back: Vec<String> = Lines::decode(&bytes).unwrap();
//! assert_eq!(back, ["a", "b"]);
//! ```

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::message::header;
use crate::{BoxError, Envelope, Error, Message, Text};

#[cfg(feature = "cbor")]
mod cbor;
#[cfg(feature = "msgpack")]
mod msgpack;
#[cfg(feature = "protobuf")]
mod protobuf;

#[cfg(feature = "cbor")]
pub use cbor::Cbor;
#[cfg(feature = "msgpack")]
pub use msgpack::MsgPack;
#[cfg(feature = "protobuf")]
pub use protobuf::Protobuf;

/// A payload format: its content type. What it can decode and encode is
/// said by [`Decode`] and [`Encode`].
///
/// ```
/// use ruststream::{Codec, Json};
///
/// assert_eq!(Json::CONTENT_TYPE, "application/json");
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a codec",
    label = "the `codec` argument must name a type implementing `ruststream::Codec`",
    note = "use `ruststream::Json` (the default), a codec of `ruststream::codec` behind its feature, or implement `ruststream::Codec`"
)]
pub trait Codec: Send + Sync + 'static {
    /// The MIME type every message this codec encodes carries in its
    /// `content-type` header.
    const CONTENT_TYPE: &'static str;
}

/// A codec that decodes payloads into `T`.
///
/// ```
/// use ruststream::Json;
/// use ruststream::codec::Decode;
///
/// let back: Vec<u32> = Json::decode(&"[1,2,3]".into()).unwrap();
/// assert_eq!(back, [1, 2, 3]);
/// ```
#[diagnostic::on_unimplemented(
    message = "the codec `{Self}` cannot decode `{T}`",
    note = "Json, MsgPack and Cbor decode `serde::Deserialize` types; Protobuf decodes `prost::Message` types"
)]
pub trait Decode<T>: Codec {
    /// Decodes a payload. An error marks the message malformed: it never
    /// reaches the handler.
    fn decode(payload: &Bytes) -> Result<T, BoxError>;
}

/// A codec that encodes `T` into payloads.
///
/// ```
/// use ruststream::Json;
/// use ruststream::codec::Encode;
///
/// let bytes = Json::encode(&vec![1, 2, 3]).unwrap();
/// assert_eq!(&bytes[..], b"[1,2,3]");
/// ```
#[diagnostic::on_unimplemented(
    message = "the codec `{Self}` cannot encode `{T}`",
    note = "Json, MsgPack and Cbor encode `serde::Serialize` types; Protobuf encodes `prost::Message` types"
)]
pub trait Encode<T: ?Sized>: Codec {
    /// Encodes a value.
    fn encode(value: &T) -> Result<Bytes, BoxError>;
}

/// Whether a `content-type` header names `expected`: the media type before
/// any parameters (`; charset=..`), ignoring case and spaces.
///
/// ```
/// use ruststream::codec::same_media_type;
///
/// assert!(same_media_type("Application/JSON; charset=utf-8", "application/json"));
/// assert!(!same_media_type("application/msgpack", "application/json"));
/// ```
pub fn same_media_type(content_type: &str, expected: &str) -> bool {
    // The common case first: the type as a codec stamps it.
    if content_type == expected {
        return true;
    }
    let media = content_type.split(';').next().unwrap_or_default().trim();
    media.eq_ignore_ascii_case(expected)
}

/// `value` encoded by `C`, as a message carrying `C`'s content type.
#[inline]
pub(crate) fn encode_message<C: Encode<T>, T: ?Sized>(value: &T) -> crate::Result<Message> {
    let payload = C::encode(value).map_err(Error::Encode)?;
    let mut message = Message::new(payload);
    stamp(&mut message, C::CONTENT_TYPE);
    Ok(message)
}

/// Sets `message`'s `content-type` header (messages and replies alike).
#[inline]
pub(crate) fn stamp(message: &mut Message, content_type: &'static str) {
    message.headers_mut().insert(
        Text::from_static(header::CONTENT_TYPE),
        Text::from_static(content_type),
    );
}

/// A reply decoded by `C`; a reply of another content type is a decode
/// error that names both.
pub(crate) fn decode_reply<C: Decode<R>, R>(reply: &Envelope) -> crate::Result<R> {
    if let Some(got) = reply.headers().get(header::CONTENT_TYPE)
        && !same_media_type(got, C::CONTENT_TYPE)
    {
        return Err(Error::Decode(
            format!(
                "the reply is `{got}`, and this side decodes `{}`",
                C::CONTENT_TYPE
            )
            .into(),
        ));
    }
    C::decode(reply.payload()).map_err(Error::Decode)
}

/// A thread's scratch buffer above this capacity is not kept: one large
/// message does not hold its memory for the life of the thread.
const SCRATCH_KEPT: usize = 64 * 1024;

std::thread_local! {
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// `write` into a scratch buffer of this thread, then copied out at its
/// exact size: one allocation per encoded value whatever its size, where a
/// `Vec` grown for the value and handed to `Bytes` costs its growth and, for
/// spare capacity, `Bytes`' own header.
pub(crate) fn encode_with_scratch<E>(
    write: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) -> Result<Bytes, E> {
    let mut write = Some(write);
    let mut encode = |buf: &mut Vec<u8>| {
        buf.clear();
        let write = write.take().expect("encoded once");
        write(buf).map(|()| Bytes::copy_from_slice(buf))
    };
    let kept = SCRATCH.try_with(|scratch| {
        // Taken, not borrowed: an encoder inside `write` finds no buffer
        // and grows its own.
        let mut buf = scratch.take();
        let written = encode(&mut buf);
        if buf.capacity() <= SCRATCH_KEPT {
            scratch.set(buf);
        }
        written
    });
    // Without the thread's buffer (it is being torn down), a buffer of its own.
    kept.unwrap_or_else(|_| encode(&mut Vec::new()))
}

/// JSON through `serde_json`: the default codec.
#[derive(Clone, Copy, Debug, Default)]
pub struct Json;

impl Codec for Json {
    const CONTENT_TYPE: &'static str = "application/json";
}

impl<T: DeserializeOwned> Decode<T> for Json {
    #[inline]
    fn decode(payload: &Bytes) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(payload)?)
    }
}

impl<T: Serialize + ?Sized> Encode<T> for Json {
    fn encode(value: &T) -> Result<Bytes, BoxError> {
        Ok(encode_with_scratch(|buf| {
            serde_json::to_writer(buf, value)
        })?)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// Encodes its inner value with `Json` while being encoded itself: the
    /// inner encode finds no scratch buffer (the outer one has it) and grows
    /// its own.
    struct Nested(Vec<u32>);

    impl Serialize for Nested {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let inner = Json::encode(&self.0).map_err(serde::ser::Error::custom)?;
            s.serialize_str(std::str::from_utf8(&inner).expect("JSON is UTF-8"))
        }
    }

    #[test]
    fn values_of_any_size_encode_once_and_exactly() {
        for len in [0, 10, 300, SCRATCH_KEPT + 1, 3] {
            let value = "x".repeat(len);
            let encoded = Json::encode(&value).expect("a string encodes");
            assert_eq!(
                encoded,
                serde_json::to_vec(&value).expect("a string encodes")
            );
        }
    }

    #[test]
    fn an_encoder_inside_an_encoder_gets_its_own_buffer() {
        let encoded = Json::encode(&Nested(vec![1, 2, 3])).expect("nested values encode");
        assert_eq!(&encoded[..], br#""[1,2,3]""#);
    }

    #[test]
    fn a_failed_encode_leaves_nothing_behind_for_the_next() {
        let mut bad = BTreeMap::new();
        bad.insert(vec![1u8], 1);
        assert!(Json::encode(&bad).is_err(), "JSON keys must be strings");
        assert_eq!(&Json::encode(&7).expect("a number encodes")[..], b"7");
    }
}
