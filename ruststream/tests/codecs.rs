//! Codecs (issue 20): JSON, MessagePack, CBOR and Protobuf round-trip
//! through a subscriber and a publisher that name them; every encoded
//! message carries its content type; a subscriber handed a content type it
//! does not read treats the message as malformed (never reaches the
//! handler, dead-lettered with the reason, a request gets a protocol error —
//! RT-7's decode step).

#![cfg(all(feature = "msgpack", feature = "cbor", feature = "protobuf"))]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::within;
use ruststream::codec::{Cbor, MsgPack, Protobuf};
use ruststream::prelude::*;
use ruststream::{Codec, Error, Json, SubscribeOptions, header};

const WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    id: u64,
    item: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Receipt {
    id: u64,
    total_cents: u64,
}

/// A Protobuf message, as `prost-build` would generate it.
#[derive(Clone, PartialEq, prost::Message)]
struct Reading {
    #[prost(string, tag = "1")]
    sensor: String,
    #[prost(sint64, tag = "2")]
    millicelsius: i64,
}

fn receipt(order: &Order) -> Receipt {
    Receipt {
        id: order.id,
        total_cents: 100 * order.item.len() as u64,
    }
}

#[subscriber("codec.json")]
async fn json_orders(order: Order) -> Receipt {
    receipt(&order)
}

#[subscriber("codec.msgpack", codec = MsgPack)]
async fn msgpack_orders(order: Order) -> Receipt {
    receipt(&order)
}

#[subscriber("codec.cbor", codec = ruststream::codec::Cbor)]
async fn cbor_orders(order: Order) -> Result<Receipt, HandlerError> {
    Ok(receipt(&order))
}

#[subscriber("codec.protobuf", codec = Protobuf)]
async fn protobuf_readings(reading: Reading) -> Reading {
    Reading {
        sensor: reading.sensor.to_uppercase(),
        millicelsius: reading.millicelsius + 1,
    }
}

/// Sends one value through `subject` with codec `C` and returns the reply
/// as `C` decodes it, after checking the request carried `C`'s content
/// type on the wire.
async fn round_trip<C, T, R>(broker: &MemoryBroker, subject: &str, value: &T) -> R
where
    C: Codec + ruststream::codec::Encode<T> + ruststream::codec::Decode<R>,
{
    let client = Publisher::new(broker.clone()).with_codec::<C>();
    let message = client.encode(value).unwrap();
    assert_eq!(
        message.headers().get(header::CONTENT_TYPE),
        Some(C::CONTENT_TYPE),
        "an encoded message names its codec"
    );
    let reply = client
        .request_message(subject, message, WAIT)
        .await
        .unwrap();
    assert_eq!(
        reply.headers().get(header::CONTENT_TYPE),
        Some(C::CONTENT_TYPE),
        "the reply is encoded by the subscriber's codec and says so"
    );
    client.request(subject, value, WAIT).await.unwrap()
}

#[tokio::test]
async fn every_codec_round_trips_through_a_subscriber_and_a_publisher() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(json_orders)
        .subscriber(msgpack_orders)
        .subscriber(cbor_orders)
        .subscriber(protobuf_readings)
        .start()
        .await
        .unwrap();
    let order = Order {
        id: 7,
        item: "lamp".into(),
    };
    let expected = receipt(&order);

    let got: Receipt = round_trip::<Json, _, _>(&broker, "codec.json", &order).await;
    assert_eq!(got, expected);
    let got: Receipt = round_trip::<MsgPack, _, _>(&broker, "codec.msgpack", &order).await;
    assert_eq!(got, expected);
    let got: Receipt = round_trip::<Cbor, _, _>(&broker, "codec.cbor", &order).await;
    assert_eq!(got, expected);
    let reading = Reading {
        sensor: "t1".into(),
        millicelsius: -2500,
    };
    let got: Reading = round_trip::<Protobuf, _, _>(&broker, "codec.protobuf", &reading).await;
    assert_eq!(
        got,
        Reading {
            sensor: "T1".into(),
            millicelsius: -2499
        }
    );
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn each_codec_writes_its_own_format_on_the_wire() {
    let order = Order {
        id: 1,
        item: "x".into(),
    };
    let json = Publisher::new(MemoryBroker::new()).encode(&order).unwrap();
    assert_eq!(json.payload(), &br#"{"id":1,"item":"x"}"#[..]);
    let msgpack = Publisher::new(MemoryBroker::new())
        .with_codec::<MsgPack>()
        .encode(&order)
        .unwrap();
    // A fixmap of two entries, fields by name.
    assert_eq!(msgpack.payload()[0], 0x82);
    assert_eq!(
        msgpack.headers().get(header::CONTENT_TYPE),
        Some("application/msgpack")
    );
    let cbor = Publisher::new(MemoryBroker::new())
        .with_codec::<Cbor>()
        .encode(&order)
        .unwrap();
    // A map of two entries (major type 5).
    assert_eq!(cbor.payload()[0], 0xa2);
    assert_eq!(
        cbor.headers().get(header::CONTENT_TYPE),
        Some("application/cbor")
    );
    let protobuf = Publisher::new(MemoryBroker::new())
        .with_codec::<Protobuf>()
        .encode(&Reading {
            sensor: "a".into(),
            millicelsius: 1,
        })
        .unwrap();
    assert_eq!(&protobuf.payload()[..], &[0x0a, 0x01, b'a', 0x10, 0x02]);
    assert_eq!(
        protobuf.headers().get(header::CONTENT_TYPE),
        Some("application/x-protobuf")
    );
}

static MISMATCH_CALLS: AtomicUsize = AtomicUsize::new(0);

#[subscriber(
    "codec.mismatch",
    max_attempts = 5,
    dead_letter = "codec.mismatch.dead"
)]
async fn json_only(order: Order) -> Receipt {
    MISMATCH_CALLS.fetch_add(1, Ordering::SeqCst);
    receipt(&order)
}

/// For each other codec: the message never reaches the JSON handler, is
/// dead-lettered at once (malformed input is not retried) with a reason
/// naming both content types, and a request gets a protocol error.
#[tokio::test]
async fn a_content_type_the_subscriber_does_not_read_is_malformed() {
    let broker = MemoryBroker::new();
    let mut dead = broker
        .subscribe(SubscribeOptions::new("codec.mismatch.dead"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(json_only)
        .start()
        .await
        .unwrap();
    let order = Order {
        id: 3,
        item: "mug".into(),
    };
    let client = Publisher::new(broker.clone());
    let messages = [
        (
            "application/msgpack",
            client
                .clone()
                .with_codec::<MsgPack>()
                .encode(&order)
                .unwrap(),
        ),
        (
            "application/cbor",
            client.clone().with_codec::<Cbor>().encode(&order).unwrap(),
        ),
        (
            "application/x-protobuf",
            client
                .clone()
                .with_codec::<Protobuf>()
                .encode(&Reading::default())
                .unwrap(),
        ),
    ];
    for (content_type, message) in messages {
        client
            .send("codec.mismatch", message.clone())
            .await
            .unwrap();
        let letter = within(5, "the dead letter", dead.next()).await.unwrap();
        let reason = letter.envelope().headers().get(header::ERROR).unwrap();
        assert_eq!(
            reason,
            format!(
                "malformed payload: content type `{content_type}`, and this subscriber reads `application/json`"
            ),
        );
        assert_eq!(
            letter.envelope().payload(),
            message.payload(),
            "the dead letter keeps the original payload"
        );
        letter.ack().await.unwrap();

        let err = client
            .request_message("codec.mismatch", message, WAIT)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, Error::Protocol(reason) if reason.contains(content_type)),
            "a request in the wrong format gets a protocol error naming it, got {err:?}"
        );
        let letter = within(5, "the request's dead letter", dead.next())
            .await
            .unwrap();
        letter.ack().await.unwrap();
    }
    assert_eq!(
        MISMATCH_CALLS.load(Ordering::SeqCst),
        0,
        "the handler never ran"
    );
    // The same subscriber still handles JSON, with or without parameters on
    // its content type, and without the header at all.
    let json = client.encode(&order).unwrap();
    let with_charset = Message::new(json.payload().clone())
        .with_header(header::CONTENT_TYPE, "Application/JSON; charset=utf-8");
    let bare = Message::new(json.payload().clone());
    for message in [json, with_charset, bare] {
        let reply = client
            .request_message("codec.mismatch", message, WAIT)
            .await
            .unwrap();
        let got: Receipt = serde_json::from_slice(reply.payload()).unwrap();
        assert_eq!(got, receipt(&order));
    }
    assert_eq!(MISMATCH_CALLS.load(Ordering::SeqCst), 3);
    running.shutdown().await.unwrap();
}

#[subscriber("codec.raw")]
async fn raw(payload: Bytes) -> String {
    format!("{} bytes", payload.len())
}

/// Raw bodies take any content type, and a raw reply claims none.
#[tokio::test]
async fn a_raw_body_takes_any_content_type_and_a_raw_reply_claims_none() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(raw)
        .start()
        .await
        .unwrap();
    let client = Publisher::new(broker.clone()).with_codec::<Cbor>();
    let message = client.encode(&[1u8, 2, 3]).unwrap();
    let len = message.payload().len();
    let reply = client
        .request_message("codec.raw", message, WAIT)
        .await
        .unwrap();
    assert_eq!(reply.payload(), format!("{len} bytes").as_bytes());
    assert_eq!(reply.headers().get(header::CONTENT_TYPE), None);
    running.shutdown().await.unwrap();
}

#[subscriber("codec.reply", codec = MsgPack)]
async fn msgpack_reply(_request: Bytes) -> Receipt {
    Receipt {
        id: 1,
        total_cents: 2,
    }
}

/// A caller whose codec does not read the reply's content type gets a
/// decode error that names both, not garbage.
#[tokio::test]
async fn a_reply_in_another_format_is_a_decode_error_that_names_both() {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(msgpack_reply)
        .start()
        .await
        .unwrap();
    let client = Publisher::new(broker.clone());
    let err = client
        .request::<_, Receipt>("codec.reply", &1, WAIT)
        .await
        .unwrap_err();
    let Error::Decode(reason) = &err else {
        panic!("expected a decode error, got {err:?}");
    };
    assert_eq!(
        reason.to_string(),
        "the reply is `application/msgpack`, and this side decodes `application/json`"
    );
    let got: Receipt = client
        .with_codec::<MsgPack>()
        .request("codec.reply", &1, WAIT)
        .await
        .unwrap();
    assert_eq!(got.total_cents, 2);
    running.shutdown().await.unwrap();
}

#[subscriber("codec.garbage", codec = Protobuf, dead_letter = "codec.garbage.dead")]
async fn protobuf_only(_reading: Reading) {}

/// Bytes that claim the right format but do not decode are malformed too.
#[tokio::test]
async fn bytes_that_do_not_decode_are_dead_lettered_with_the_codec_error() {
    let broker = MemoryBroker::new();
    let mut dead = broker
        .subscribe(SubscribeOptions::new("codec.garbage.dead"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(protobuf_only)
        .start()
        .await
        .unwrap();
    let message = Message::new(Bytes::from_static(&[0x0a, 0xff]))
        .with_header(header::CONTENT_TYPE, Protobuf::CONTENT_TYPE);
    Publisher::new(broker.clone())
        .send("codec.garbage", message)
        .await
        .unwrap();
    let letter = within(5, "the dead letter", dead.next()).await.unwrap();
    let reason = letter.envelope().headers().get(header::ERROR).unwrap();
    assert!(
        reason.starts_with("malformed payload: "),
        "the reason says malformed: {reason}"
    );
    letter.ack().await.unwrap();
    running.shutdown().await.unwrap();
}
