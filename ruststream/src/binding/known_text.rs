//! Header names and values the framework writes itself — its own header
//! names and the codecs' content types — which a binding turns into static
//! [`Text`]s when it receives them: no copy and no allocation for the
//! `content-type` every codec-encoded message carries.

use crate::Text;
use crate::message::header;

/// What the framework writes into headers on every broker.
const KNOWN: &[&str] = &[
    header::CONTENT_TYPE,
    header::STATUS,
    header::ERROR,
    header::ORIGINAL_SUBJECT,
    header::ATTEMPT,
    header::ORIGINAL_ID,
    header::RETRIES,
    header::RETRY_DELAY_MS,
    <crate::Json as crate::Codec>::CONTENT_TYPE,
    #[cfg(feature = "msgpack")]
    <crate::codec::MsgPack as crate::Codec>::CONTENT_TYPE,
    #[cfg(feature = "cbor")]
    <crate::codec::Cbor as crate::Codec>::CONTENT_TYPE,
    #[cfg(feature = "protobuf")]
    <crate::codec::Protobuf as crate::Codec>::CONTENT_TYPE,
];

/// `s` as one of the strings the framework writes into headers.
pub(crate) fn known(s: &str) -> Option<&'static str> {
    KNOWN.iter().copied().find(|known| *known == s)
}

/// A received header name or value as a [`Text`]: static when known.
#[cfg_attr(
    not(any(
        feature = "nats",
        feature = "redis",
        feature = "rabbitmq",
        feature = "kafka"
    )),
    allow(dead_code)
)]
pub(crate) fn text(s: &str) -> Text {
    known(s).map_or_else(|| Text::from(s), Text::from_static)
}

/// [`text`] of a string the binding owns already: kept as it is unless known.
#[cfg_attr(
    not(any(feature = "redis", feature = "rabbitmq", feature = "mqtt")),
    allow(dead_code)
)]
pub(crate) fn owned_text(s: String) -> Text {
    known(&s).map_or_else(|| Text::from(s), Text::from_static)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_framework_writes_arrives_without_a_copy() {
        for sent in [
            header::CONTENT_TYPE,
            <crate::Json as crate::Codec>::CONTENT_TYPE,
        ] {
            let kept = known(sent).expect("the framework writes it");
            let received = String::from(sent);
            for text in [text(&received), owned_text(received.clone())] {
                assert_eq!(text.as_str().as_ptr(), kept.as_ptr(), "not a copy");
            }
        }
        for other in ["x-tenant", "application/json; charset=utf-8", ""] {
            assert_eq!(known(other), None);
            assert_eq!(text(other).as_str(), other);
            assert_eq!(owned_text(other.to_owned()).as_str(), other);
        }
    }
}
