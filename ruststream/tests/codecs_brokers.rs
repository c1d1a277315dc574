//! Codecs on the network brokers (issue 20): the `content-type` header a
//! codec sets survives NATS, Redis Streams and RabbitMQ, a subscriber of
//! that codec answers a request in it, and a request in another format gets
//! a protocol error there too (RT-7's decode step).
//!
//! Needs the brokers on loopback (`scripts/test.sh` starts them; see
//! `../shared/services.md`).

#![cfg(all(
    feature = "msgpack",
    feature = "nats",
    feature = "redis",
    feature = "rabbitmq"
))]

mod common;

use std::time::Duration;

use common::unique;
use ruststream::codec::MsgPack;
use ruststream::nats::NatsBroker;
use ruststream::prelude::*;
use ruststream::rabbitmq::RabbitBroker;
use ruststream::redis::RedisBroker;
use ruststream::{Codec, Error, Requester, header};

const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Reading {
    sensor: String,
    millicelsius: i64,
}

#[subscriber("rs_test.codec", codec = MsgPack)]
async fn warmer(reading: Reading) -> Reading {
    Reading {
        sensor: reading.sensor,
        millicelsius: reading.millicelsius + 500,
    }
}

async fn round_trip<B: Broker + Requester>(broker: B) {
    let subject = unique("rs_test.codec");
    let running = App::new()
        .broker(broker.clone())
        .subscriber(warmer.configure(|c| c.on_subject(subject.clone())))
        .start()
        .await
        .unwrap();
    let client = Publisher::new(broker.clone()).with_codec::<MsgPack>();
    let reading = Reading {
        sensor: "t1".into(),
        millicelsius: 20_000,
    };
    let message = client.encode(&reading).unwrap();
    let reply = client
        .request_message(&subject, message, WAIT)
        .await
        .unwrap();
    assert_eq!(
        reply.headers().get(header::CONTENT_TYPE),
        Some(MsgPack::CONTENT_TYPE),
        "the reply's content type crossed the broker"
    );
    let back: Reading = client.request(&subject, &reading, WAIT).await.unwrap();
    assert_eq!(back.millicelsius, 20_500);

    let err = Publisher::new(broker)
        .request::<_, Reading>(&subject, &reading, WAIT)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Protocol(reason) if reason.contains("application/json")),
        "a JSON request to a MessagePack subscriber is refused: {err:?}"
    );
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn content_types_cross_nats() {
    let url =
        std::env::var("RUSTSTREAM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".to_owned());
    let nats = NatsBroker::connect(&url).await.unwrap_or_else(|err| {
        panic!("NATS is not reachable at {url}: {err}; run scripts/test.sh, which starts it")
    });
    round_trip(nats).await;
}

#[tokio::test]
async fn content_types_cross_redis() {
    let url = std::env::var("RUSTSTREAM_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let redis = RedisBroker::connect(&url).await.unwrap_or_else(|err| {
        panic!("Redis is not reachable at {url}: {err}; run scripts/test.sh, which starts it")
    });
    round_trip(redis).await;
}

#[tokio::test]
async fn content_types_cross_rabbitmq() {
    let url = std::env::var("RUSTSTREAM_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_owned());
    let rabbit = RabbitBroker::connect(&url).await.unwrap_or_else(|err| {
        panic!("RabbitMQ is not reachable at {url}: {err}; run scripts/test.sh, which starts it")
    });
    round_trip(rabbit).await;
}
