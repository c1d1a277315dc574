//! Typed publishing on any broker: values go through the JSON codec; replies
//! come back decoded, with the remote side's failures mapped to [`Error`].

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::binding::{Broker, Requester};
use crate::message::header;
use crate::{Codec, Envelope, Error, Json, Message, Result};

/// Typed `publish` and `request` for every [`Broker`], JSON-encoded.
///
/// Values are always JSON here, strings included (`"ada"` is sent with its
/// quotes). A handler whose body is `String`, `Bytes` or `Vec<u8>` receives the
/// raw payload, so send it raw bytes with
/// [`Broker::publish_message`] / [`Requester::request_message`].
///
/// ```
/// use std::time::Duration;
/// use ruststream::prelude::*;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let broker = MemoryBroker::new();
/// // Nobody subscribes yet: a publish is dropped, a request fails fast.
/// broker.publish("orders", &serde_json::json!({"id": 1})).await?;
/// let err = broker
///     .request::<_, u32>("orders", &1, Duration::from_millis(50))
///     .await
///     .unwrap_err();
/// assert!(matches!(err, ruststream::Error::NoResponders(_)));
/// # Ok::<_, ruststream::Error>(()) }).unwrap();
/// ```
pub trait Publish: Broker {
    /// Encodes `value` and publishes it to `subject` (JQ-19 deadline: the
    /// broker's default publish timeout).
    fn publish<T: Serialize + ?Sized + Sync>(
        &self,
        subject: &str,
        value: &T,
    ) -> impl Future<Output = Result<()>> + Send {
        let encoded = Json::encode(value).map_err(Error::Encode);
        async move {
            self.publish_message(subject, Message::new(encoded?), None)
                .await
        }
    }

    /// Sends `value` as a request and decodes the reply. A reply that reports
    /// a failure is an error, as in [`Requester::request_message`]:
    /// [`Error::Protocol`] (the payload did not decode on the other side,
    /// JQ-13), [`Error::Handler`] or [`Error::StructuralLimit`].
    fn request<T, R>(
        &self,
        subject: &str,
        value: &T,
        timeout: Duration,
    ) -> impl Future<Output = Result<R>> + Send
    where
        Self: Requester,
        T: Serialize + ?Sized + Sync,
        R: DeserializeOwned,
    {
        let encoded = Json::encode(value).map_err(Error::Encode);
        async move {
            let reply = self
                .request_message(subject, Message::new(encoded?), timeout)
                .await?;
            Json::decode(reply.payload()).map_err(Error::Decode)
        }
    }
}

impl<B: Broker> Publish for B {}

/// Maps a reply's status header to a result: what
/// [`Requester::request_message`] does with the reply
/// [`Requester::send_request`] returns.
pub fn reply_result(reply: Envelope) -> Result<Envelope> {
    let error = || reply.headers().get(header::ERROR).unwrap_or("").to_owned();
    match reply.headers().get(header::STATUS) {
        Some("protocol-error") => Err(Error::Protocol(error())),
        Some("handler-error") => Err(Error::Handler(error())),
        Some("structural-limit") => Err(Error::StructuralLimit(error())),
        _ => Ok(reply),
    }
}
