//! Messages to MQTT 5 publish properties and back: headers are user
//! properties, the reply address is the response topic, the correlation id
//! is the correlation data, the key is the `ruststream-key` user property.

use bytes::Bytes;
use rumqttc::v5::mqttbytes::QoS;
use rumqttc::v5::mqttbytes::v5::{Publish, PublishProperties};

use crate::binding::known_text::owned_text;
use crate::message::header;
use crate::{Envelope, Message, Text};

/// User property carrying [`Message::key`].
pub(super) const KEY: &str = "ruststream-key";
/// User property of a redelivered copy: its attempt.
pub(super) const REDELIVERY: &str = "ruststream-redelivery";

/// The publish properties of `message`, plus `extra` user properties.
pub(super) fn properties(message: &Message, extra: &[(&str, String)]) -> PublishProperties {
    let headers = message.headers();
    let mut user = Vec::with_capacity(headers.len() + extra.len() + 1);
    for (name, value) in headers.iter() {
        user.push((name.to_owned(), value.to_owned()));
    }
    if let Some(key) = message.key() {
        user.push((KEY.to_owned(), key.as_str().to_owned()));
    }
    for (name, value) in extra {
        user.push(((*name).to_owned(), value.clone()));
    }
    PublishProperties {
        user_properties: user,
        response_topic: message.reply_to().map(|r| r.as_str().to_owned()),
        correlation_data: message
            .correlation_id()
            .map(|id| Bytes::copy_from_slice(id.as_str().as_bytes())),
        ..Default::default()
    }
}

/// A received publish as the runtime sees it: subject, headers, key, reply
/// address, correlation id and attempt. `copy_of`: the publish is a
/// redelivered copy (from the subscription's retry topic), whose subject is
/// in its `ruststream-original-subject` property; the DUP flag (the broker
/// sending it again after a reconnect) adds one attempt. `last` caches the
/// subject of the previous delivery: a subscription usually sees the same
/// few topics, and a cached subject clones without allocating.
pub(super) fn envelope(publish: Publish, copy: bool, last: &mut Option<Text>) -> Envelope {
    let Publish {
        dup,
        topic,
        payload,
        properties,
        ..
    } = publish;
    let mut subject = match last {
        // The same bytes as last time: valid UTF-8 then, no check again.
        Some(text) if text.as_str().as_bytes() == topic.as_ref() => text.clone(),
        _ => last
            .insert(Text::from(String::from_utf8_lossy(&topic).as_ref()))
            .clone(),
    };
    let mut message = Message::new(payload);
    let mut attempt = 1;
    if let Some(props) = properties {
        for (name, value) in props.user_properties {
            match name.as_str() {
                KEY => message = message.with_key(value),
                REDELIVERY if copy => attempt = value.parse().unwrap_or(2),
                header::ORIGINAL_SUBJECT if copy => subject = Text::from(value),
                _ => message = message.with_header(owned_text(name), owned_text(value)),
            }
        }
        if let Some(reply) = props.response_topic {
            message = message.with_reply_to(reply);
        }
        if let Some(data) = props.correlation_data {
            message = message.with_correlation_id(String::from_utf8_lossy(&data).into_owned());
        }
    }
    Envelope::new(subject, message).with_attempt(attempt + u32::from(dup))
}

/// A dead-lettered copy answers nobody: the request it was has had its
/// failure reply.
pub(super) fn without_reply(message: &Message) -> Message {
    let mut out = Message::new(message.payload().clone()).with_headers(message.headers().clone());
    if let Some(key) = message.key() {
        out = out.with_key(key.clone());
    }
    if let Some(id) = message.correlation_id() {
        out = out.with_correlation_id(id.clone());
    }
    out
}

/// What `rumqttc` builds an ack from: the packet id and the QoS.
pub(super) fn ack_of(pkid: u16, qos: QoS) -> Publish {
    let mut publish = Publish::new("", qos, bytes::Bytes::new(), None);
    publish.pkid = pkid;
    publish
}

/// A topic one can publish to: not empty, no wildcards.
pub(super) fn valid_topic(topic: &str) -> bool {
    !topic.is_empty() && !topic.contains(['+', '#'])
}
