//! Request/reply, and a broker after close.

use std::time::Duration;

use super::helpers::*;
use super::{Outcome, RECEIVE_TIMEOUT};
use crate::binding::{Broker, Delivery, Requester, SubscribeOptions};
use crate::{Error, Message};

pub(super) async fn request_reply_round_trip<B: Requester>(broker: &B, p: &str) -> Outcome {
    let subject = format!("{p}.rpc");
    let mut service = subscribe(broker, SubscribeOptions::new(subject.as_str())).await?;
    let responder = async {
        let d = next(&mut service, "the request").await?;
        let reply_to = d
            .envelope()
            .reply_to()
            .ok_or("the request has no reply address")?
            .clone();
        let answer = format!("re: {}", text(&d));
        // A responder echoes the correlation id, as every RPC responder does
        // (and as ruststream's own replies do): some brokers route replies
        // by it.
        let mut reply = Message::new(answer);
        if let Some(id) = d.envelope().correlation_id() {
            reply = reply.with_correlation_id(id.clone());
        }
        broker
            .publish_message(&reply_to, reply, None)
            .await
            .map_err(failed("reply"))?;
        d.ack().await.map_err(failed("ack"))
    };
    let request = broker.request_message(&subject, Message::new("ping"), RECEIVE_TIMEOUT);
    let (served, reply) = tokio::join!(responder, request);
    served?;
    let reply = reply.map_err(failed("request"))?;
    let got = String::from_utf8_lossy(reply.payload()).into_owned();
    ensure(got == "re: ping", || format!("reply {got:?}"))?;
    let nobody = broker
        .request_message(
            &format!("{p}.nobody"),
            Message::new("?"),
            Duration::from_secs(2),
        )
        .await;
    ensure(
        matches!(nobody, Err(Error::NoResponders(_) | Error::Timeout(_))),
        || format!("a request nobody serves gave {nobody:?}"),
    )
}

pub(super) async fn close_then_publish_is_a_clear_error<B: Broker>(broker: &B, p: &str) -> Outcome {
    broker.close().await.map_err(failed("close"))?;
    let after = broker
        .publish_message(&format!("{p}.late"), Message::new("x"), None)
        .await;
    ensure(matches!(after, Err(Error::Closed(_))), || {
        format!("publish after close gave {after:?}")
    })
}

pub(super) async fn double_close_is_fine<B: Broker>(broker: &B, _p: &str) -> Outcome {
    broker.close().await.map_err(failed("first close"))?;
    broker.close().await.map_err(failed("second close"))
}
