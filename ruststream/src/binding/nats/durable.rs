//! The durable consumer of a JetStream queue group: the group's place in the
//! stream, so it outlives every member. It has no inactivity threshold
//! unless the user sets one ([`StreamSpec::inactive_threshold`]), and a
//! member that opens it brings its settings up to date. Should it be gone
//! anyway (that threshold passed, an operator deleted it), it is recreated
//! where the group had got to — never from the start of the stream, which
//! would hand every acknowledged message out again: members checkpoint its
//! ack floor in a small stream of their own, `RUSTSTREAM_DURABLES`.
//!
//! [`StreamSpec::inactive_threshold`]: super::StreamSpec::inactive_threshold

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_nats::jetstream::consumer::{self, FromConsumer, PullConsumer, pull};
use async_nats::jetstream::context::ConsumerInfoErrorKind;
use async_nats::jetstream::{self, stream};
use tokio::time::Instant;

use crate::{Error, Result};

/// The stream of checkpoints, one per durable (the last one only).
const CHECKPOINTS: &str = "RUSTSTREAM_DURABLES";
const CHECKPOINT_SUBJECTS: &str = "$RS.DURABLES.>";

/// How often members checkpoint without a threshold set; with one, twice
/// per threshold at least.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(30);

/// Opens the durable `wanted` names on `stream`: brought up to date where
/// it exists, recreated from its last checkpoint where it existed before,
/// created reading the stream from its start where it never did.
pub(super) async fn open(
    context: &jetstream::Context,
    stream: &stream::Stream,
    wanted: pull::Config,
) -> Result<(PullConsumer, Checkpoints)> {
    let name = wanted.durable_name.clone().unwrap_or_default();
    let info = stream.cached_info();
    let stream_name = info.config.name.clone();
    // A stream deleted and made again under the same name starts over: a
    // checkpoint of the old one must not skip the new one's messages.
    let incarnation = info.created.unix_timestamp_nanos();
    let mut checkpoints = Checkpoints::new(
        context,
        (&stream_name, incarnation),
        &name,
        wanted.inactive_threshold,
    );
    let consumer = match stream.consumer_info(&name).await {
        Ok(info) => up_to_date(stream, info, wanted).await?,
        Err(err) if err.kind() == ConsumerInfoErrorKind::NotFound => {
            let mut config = wanted;
            match checkpoints.last().await {
                Some((floor, age)) => {
                    tracing::warn!(
                        stream = %stream_name,
                        consumer = %name,
                        from = floor + 1,
                        checkpoint_age = ?age,
                        "JetStream durable consumer was gone (its inactive_threshold passed, or \
                         it was deleted): recreated from its last checkpointed ack floor; \
                         messages acked after that checkpoint are delivered again"
                    );
                    crate::metrics::connection_event("nats-jetstream", "durable_recreated");
                    config.deliver_policy = consumer::DeliverPolicy::ByStartSequence {
                        start_sequence: floor + 1,
                    };
                }
                // A new group reads the stream from its start.
                None => config.deliver_policy = consumer::DeliverPolicy::All,
            }
            stream
                .create_consumer(config)
                .await
                .map_err(|err| consumer_error(&name, err))?
        }
        Err(err) => return Err(consumer_error(&name, err)),
    };
    checkpoints.write(&consumer);
    Ok((consumer, checkpoints))
}

/// The existing durable, with the settings this member wants where they
/// differ (a durable made by an older version, with a five-minute
/// threshold; another `max_attempts`). Where and how it delivers is the
/// group's and stays as it is.
async fn up_to_date(
    stream: &stream::Stream,
    info: consumer::Info,
    wanted: pull::Config,
) -> Result<PullConsumer> {
    let have = &info.config;
    let name = info.name.clone();
    let same = have.ack_wait == wanted.ack_wait
        && have.max_deliver == wanted.max_deliver
        && have.inactive_threshold == wanted.inactive_threshold;
    if same {
        return stream
            .get_consumer(&name)
            .await
            .map_err(|err| consumer_error(&name, err));
    }
    let mut config = pull::Config::try_from_consumer_config(have.clone()).unwrap_or(wanted.clone());
    config.ack_wait = wanted.ack_wait;
    config.max_deliver = wanted.max_deliver;
    config.inactive_threshold = wanted.inactive_threshold;
    match stream.create_consumer(config).await {
        Ok(consumer) => Ok(consumer),
        Err(err) => {
            // An older server may refuse some update: the durable still
            // works with its old settings.
            tracing::warn!(consumer = %name, error = %err, "JetStream durable consumer kept its old settings");
            stream
                .get_consumer(&name)
                .await
                .map_err(|err| consumer_error(&name, err))
        }
    }
}

fn consumer_error(name: &str, err: impl std::fmt::Display) -> Error {
    Error::Transport(format!("JetStream durable consumer `{name}`: {err}").into())
}

/// The checkpoints of one durable's ack floor.
pub(super) struct Checkpoints {
    context: jetstream::Context,
    subject: String,
    /// When the stream was made: a checkpoint counts for that stream only.
    incarnation: i128,
    every: Duration,
    last: Instant,
    /// A checkpoint is on its way: the next waits for a later pull.
    writing: Arc<AtomicBool>,
    /// A failed checkpoint was logged.
    warned: Arc<AtomicBool>,
}

impl Checkpoints {
    fn new(
        context: &jetstream::Context,
        (stream, incarnation): (&str, i128),
        name: &str,
        threshold: Duration,
    ) -> Self {
        let every = match threshold {
            Duration::ZERO => CHECKPOINT_EVERY,
            threshold => CHECKPOINT_EVERY.min(threshold / 2),
        };
        Checkpoints {
            context: context.clone(),
            subject: format!("$RS.DURABLES.{stream}.{name}"),
            incarnation,
            every,
            last: Instant::now(),
            writing: Arc::new(AtomicBool::new(false)),
            warned: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Checkpoints the consumer's ack floor when one is due; called as a
    /// pull is made, so a durable checkpoints while it is in use.
    pub(super) fn due(&mut self, consumer: &PullConsumer) {
        if self.last.elapsed() >= self.every {
            self.write(consumer);
        }
    }

    /// Checkpoints the consumer's ack floor, in the background.
    fn write(&mut self, consumer: &PullConsumer) {
        if self.writing.swap(true, Ordering::AcqRel) {
            return;
        }
        self.last = Instant::now();
        let (context, subject, writing) = (
            self.context.clone(),
            self.subject.clone(),
            Arc::clone(&self.writing),
        );
        let (consumer, incarnation) = (consumer.clone(), self.incarnation);
        let warned = Arc::clone(&self.warned);
        tokio::spawn(async move {
            if let Err(err) = checkpoint(&context, &subject, &consumer, incarnation).await
                && !warned.swap(true, Ordering::AcqRel)
            {
                // Without checkpoints, a durable that is gone is recreated
                // from the start of the stream: say so, once.
                tracing::warn!(error = %err, subject, "JetStream durable checkpoint not written (logged once per subscription)");
            }
            writing.store(false, Ordering::Release);
        });
    }

    /// The last checkpointed ack floor of this stream and how old it is.
    async fn last(&self) -> Option<(u64, Duration)> {
        let stream = self.context.get_stream(CHECKPOINTS).await.ok()?;
        let message = stream
            .get_last_raw_message_by_subject(&self.subject)
            .await
            .ok()?;
        // "<ack floor> <unix ms written> <stream made, unix ns>"
        let text = std::str::from_utf8(&message.payload).ok()?;
        let mut fields = text.split(' ');
        let (floor, at_ms, made) = (fields.next()?, fields.next()?, fields.next()?);
        if made.parse::<i128>().ok()? != self.incarnation {
            return None;
        }
        let age = unix_ms().saturating_sub(at_ms.parse().ok()?);
        Some((floor.parse().ok()?, Duration::from_millis(age)))
    }
}

async fn checkpoint(
    context: &jetstream::Context,
    subject: &str,
    consumer: &PullConsumer,
    incarnation: i128,
) -> std::result::Result<(), async_nats::Error> {
    let floor = consumer.get_info().await?.ack_floor.stream_sequence;
    let payload = format!("{floor} {} {incarnation}", unix_ms());
    let payload = bytes::Bytes::from(payload);
    let published = match context.publish(subject.to_owned(), payload.clone()).await {
        Ok(ack) => ack.await,
        Err(err) => return Err(err.into()),
    };
    match published {
        Ok(_) => Ok(()),
        // The first checkpoint on this server: make the stream, then again.
        Err(_) => {
            context
                .get_or_create_stream(stream::Config {
                    name: CHECKPOINTS.to_owned(),
                    subjects: vec![CHECKPOINT_SUBJECTS.to_owned()],
                    max_messages_per_subject: 1,
                    ..Default::default()
                })
                .await?;
            context.publish(subject.to_owned(), payload).await?.await?;
            Ok(())
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
