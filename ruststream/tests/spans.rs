//! The runtime's `tracing` spans, seen by a tracing subscriber of the
//! user's own (a layer that records every span, its fields and the events
//! inside it): one `process` span per delivery with OpenTelemetry's messaging
//! fields and its outcome, a span per publish, request and reply as a child
//! of the delivery that sent it, handler logs inside the delivery's span, in
//! every execution mode. And the levels: a request the handler turns down
//! is one WARN, not an ERROR.
//!
//! One subscriber for the whole test binary (apps run on several threads):
//! each test looks only at its own subjects.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use common::{unique, until, within};
use ruststream::SubscribeOptions;
use ruststream::prelude::*;
use ruststream::subscriber::SubscriberConfig;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

#[derive(Clone, Debug)]
struct SpanSeen {
    seq: u64,
    name: &'static str,
    parent: Option<u64>,
    fields: BTreeMap<String, String>,
    closed: bool,
}

#[derive(Clone, Debug)]
struct EventSeen {
    level: Level,
    /// The spans around the event, innermost first.
    scope: Vec<u64>,
    fields: BTreeMap<String, String>,
}

#[derive(Default)]
struct Seen {
    spans: Vec<SpanSeen>,
    events: Vec<EventSeen>,
}

/// Records every span and event; a span's id in the registry is reused
/// after it closes, so each gets a sequence number of its own.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Seen>>);

struct Seq(u64);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, cx: Context<'_, S>) {
        let span = cx.span(id).expect("the span is registered");
        let parent = span
            .parent()
            .and_then(|p| p.extensions().get::<Seq>().map(|s| s.0));
        let mut seen = self.0.lock().unwrap();
        let seq = seen.spans.len() as u64;
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        seen.spans.push(SpanSeen {
            seq,
            name: attrs.metadata().name(),
            parent,
            fields,
            closed: false,
        });
        span.extensions_mut().insert(Seq(seq));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, cx: Context<'_, S>) {
        let Some(seq) = cx
            .span(id)
            .and_then(|s| s.extensions().get::<Seq>().map(|s| s.0))
        else {
            return;
        };
        let mut seen = self.0.lock().unwrap();
        values.record(&mut Fields(&mut seen.spans[seq as usize].fields));
    }

    fn on_event(&self, event: &Event<'_>, cx: Context<'_, S>) {
        let scope = cx
            .event_scope(event)
            .map(|scope| {
                scope
                    .filter_map(|s| s.extensions().get::<Seq>().map(|s| s.0))
                    .collect()
            })
            .unwrap_or_default();
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        self.0.lock().unwrap().events.push(EventSeen {
            level: *event.metadata().level(),
            scope,
            fields,
        });
    }

    fn on_close(&self, id: Id, cx: Context<'_, S>) {
        if let Some(seq) = cx
            .span(&id)
            .and_then(|s| s.extensions().get::<Seq>().map(|s| s.0))
        {
            self.0.lock().unwrap().spans[seq as usize].closed = true;
        }
    }
}

fn recorder() -> &'static Recorder {
    static RECORDER: OnceLock<Recorder> = OnceLock::new();
    RECORDER.get_or_init(|| {
        let recorder = Recorder::default();
        let subscriber = tracing_subscriber::registry().with(recorder.clone());
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other tracing subscriber in this test binary");
        recorder
    })
}

impl Recorder {
    /// The closed spans called `name` about `subject`.
    fn spans(&self, name: &str, subject: &str) -> Vec<SpanSeen> {
        let seen = self.0.lock().unwrap();
        seen.spans
            .iter()
            .filter(|s| {
                s.closed
                    && s.name == name
                    && s.fields
                        .get("messaging.destination.name")
                        .map(String::as_str)
                        == Some(subject)
            })
            .cloned()
            .collect()
    }

    fn span(&self, seq: u64) -> SpanSeen {
        self.0.lock().unwrap().spans[seq as usize].clone()
    }

    /// Events whose message contains `text`.
    fn events(&self, text: &str) -> Vec<EventSeen> {
        let seen = self.0.lock().unwrap();
        seen.events
            .iter()
            .filter(|e| e.fields.get("message").is_some_and(|m| m.contains(text)))
            .cloned()
            .collect()
    }

    async fn wait_spans(&self, name: &str, subject: &str, n: usize) -> Vec<SpanSeen> {
        until(
            10,
            &format!("{n} closed `{name}` spans on `{subject}`"),
            || self.spans(name, subject).len() >= n,
        )
        .await;
        self.spans(name, subject)
    }
}

fn field<'a>(span: &'a SpanSeen, name: &str) -> &'a str {
    span.fields
        .get(name)
        .unwrap_or_else(|| panic!("span `{}` has no field `{name}`: {span:?}", span.name))
}

#[derive(serde::Serialize, serde::Deserialize, Debug)]
struct Order {
    id: u64,
    note: String,
}

#[subscriber("spans.orders")]
async fn take_order(order: Order) -> Result<(), HandlerError> {
    tracing::info!(order = order.id, "taking the order {}", order.note);
    if order.note == "fail" {
        return Err(HandlerError::retry("cannot take it now"));
    }
    Ok(())
}

/// The same handler on `threads(n)`, whose future need not be `Send`.
#[subscriber("spans.orders", threads(2))]
async fn take_order_on_threads(order: Order) -> Result<(), HandlerError> {
    take_order(order).await
}

type Mode = fn(SubscriberConfig) -> SubscriberConfig;

fn sequential(c: SubscriberConfig) -> SubscriberConfig {
    c
}

async fn start(subject: &str, dead_letter: &str, mode: Mode) -> (MemoryBroker, RunningApp) {
    recorder();
    let broker = MemoryBroker::new();
    let subject = subject.to_owned();
    let dead_letter = dead_letter.to_owned();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(take_order.configure(move |c| {
            mode(
                c.on_subject(subject)
                    .max_attempts(2)
                    .dead_letter(dead_letter),
            )
        }))
        .start()
        .await
        .unwrap();
    (broker, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_runs_in_one_process_span_with_the_messaging_fields() {
    let subject = unique("spans.ok");
    let (broker, running) = start(&subject, "spans.dead", sequential).await;
    let order = Order {
        id: 7,
        note: unique("note"),
    };
    Publisher::new(broker.clone())
        .send(
            &subject,
            Publisher::new(broker)
                .encode(&order)
                .unwrap()
                .with_correlation_id("c-7"),
        )
        .await
        .unwrap();
    let spans = recorder().wait_spans("process", &subject, 1).await;
    assert_eq!(spans.len(), 1, "one span per delivery: {spans:?}");
    let span = &spans[0];
    assert_eq!(field(span, "messaging.system"), "memory");
    assert_eq!(field(span, "messaging.operation"), "process");
    assert_eq!(field(span, "messaging.operation.type"), "process");
    assert_eq!(field(span, "messaging.message.conversation_id"), "c-7");
    assert_eq!(field(span, "ruststream.subscriber"), "spans::take_order");
    assert_eq!(field(span, "ruststream.attempt"), "1");
    assert_eq!(field(span, "ruststream.outcome"), "acked");
    assert_eq!(field(span, "otel.kind"), "consumer");
    assert_eq!(field(span, "otel.name"), format!("process {subject}"));
    assert!(
        !span.fields.contains_key("otel.status_code"),
        "a success has no error status"
    );
    // The handler's log line is inside the delivery's span.
    let logged = recorder().events(&order.note);
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0].scope.first(), Some(&span.seq), "{logged:?}");
    running.shutdown().await.unwrap();
}

/// Sends `message` to a fresh sequential subscriber (two attempts, a
/// dead-letter subject) and waits until it is dead-lettered: the subject
/// and the running app.
async fn until_dead_lettered(prefix: &str, message: ruststream::Message) -> (String, RunningApp) {
    let subject = unique(prefix);
    let dead = unique("spans.dead");
    let (broker, running) = start(&subject, &dead, sequential).await;
    let mut dead_letters = broker
        .subscribe(SubscribeOptions::new(dead.as_str()))
        .await
        .unwrap();
    Publisher::new(broker)
        .send(&subject, message)
        .await
        .unwrap();
    within(10, "the dead letter", dead_letters.next())
        .await
        .unwrap();
    (subject, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_delivery_has_a_span_per_attempt_with_its_outcome() {
    let order = serde_json::to_vec(&Order {
        id: 1,
        note: "fail".into(),
    })
    .unwrap();
    let (subject, running) =
        until_dead_lettered("spans.fail", ruststream::Message::new(order)).await;
    let mut spans = recorder().wait_spans("process", &subject, 2).await;
    spans.sort_by_key(|s| s.seq);
    let outcomes: Vec<_> = spans
        .iter()
        .map(|s| {
            (
                field(s, "ruststream.attempt"),
                field(s, "ruststream.outcome"),
            )
        })
        .collect();
    assert_eq!(outcomes, [("1", "retried"), ("2", "dead_lettered")]);
    for span in &spans {
        assert_eq!(field(span, "otel.status_code"), "error");
    }
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_delivery_has_its_span_too() {
    let (subject, running) =
        until_dead_lettered("spans.malformed", ruststream::Message::new("not json")).await;
    let spans = recorder().wait_spans("process", &subject, 1).await;
    assert_eq!(field(&spans[0], "ruststream.outcome"), "malformed");
    let refused = recorder().events("payload refused before the handler");
    assert!(
        refused
            .iter()
            .any(|e| e.scope.first() == Some(&spans[0].seq)),
        "the refusal is logged inside the delivery's span: {refused:?}"
    );
    running.shutdown().await.unwrap();
}

/// Four orders through a running app on `subject`: each handler's log
/// line is inside an acked `process` span of its own.
async fn four_in_their_spans(broker: MemoryBroker, subject: &str, what: &str) {
    let client = Publisher::new(broker);
    let notes: Vec<String> = (0..4).map(|_| unique("mode-note")).collect();
    for (id, note) in notes.iter().enumerate() {
        let order = Order {
            id: id as u64,
            note: note.clone(),
        };
        client.publish(subject, &order).await.unwrap();
    }
    let spans = recorder().wait_spans("process", subject, 4).await;
    assert_eq!(spans.len(), 4, "{what}: one span per delivery");
    for note in &notes {
        let logged = recorder().events(note);
        let inner = logged[0].scope.first().copied();
        let span = recorder()
            .span(inner.unwrap_or_else(|| panic!("{what}: no span around the handler's log")));
        assert_eq!(span.name, "process", "{what}");
        assert_eq!(field(&span, "ruststream.outcome"), "acked", "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_execution_mode_runs_each_delivery_in_its_span() {
    let modes: [(&str, Mode); 4] = [
        ("workers(2)", |c| c.workers(2)),
        ("workers(2, by_key)", |c| c.workers_by_key(2)),
        ("threads(2) of a Send handler", |c| c.threads(2)),
        ("threads(2, by_key) of a Send handler", |c| {
            c.threads_by_key(2)
        }),
    ];
    for (what, mode) in modes {
        let subject = unique("spans.mode");
        let (broker, running) = start(&subject, "spans.dead", mode).await;
        four_in_their_spans(broker, &subject, what).await;
        running.shutdown().await.unwrap();
    }
    for (what, mode) in [
        ("threads(2)", sequential as Mode),
        ("threads(2, by_key)", |c| c.threads_by_key(2)),
    ] {
        let subject = unique("spans.threads");
        let broker = MemoryBroker::new();
        let s = subject.clone();
        let running = App::new()
            .broker(broker.clone())
            .subscriber(take_order_on_threads.configure(move |c| mode(c.on_subject(s))))
            .start()
            .await
            .unwrap();
        four_in_their_spans(broker, &subject, what).await;
        running.shutdown().await.unwrap();
    }
}

#[subscriber("spans.quote")]
async fn quote(quantity: u64, ctx: Ctx) -> Result<u64, HandlerError> {
    if quantity == 0 {
        return Err(HandlerError::reject("nothing is not for sale"));
    }
    ctx.publish("spans.audit", &quantity).await?;
    Ok(42 * quantity)
}

/// `quote` on a fresh subject: the broker, the subject, the running app.
async fn start_quote(prefix: &str) -> (MemoryBroker, String, RunningApp) {
    recorder();
    let broker = MemoryBroker::new();
    let subject = unique(prefix);
    let s = subject.clone();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(quote.configure(move |c| c.on_subject(s)))
        .start()
        .await
        .unwrap();
    (broker, subject, running)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_are_spans_inside_the_delivery_that_sent_them() {
    let (broker, subject, running) = start_quote("spans.quote").await;
    let client = Publisher::new(broker);
    let price: u64 = client
        .request(&subject, &1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(price, 42);

    let request = recorder().wait_spans("send", &subject, 1).await.remove(0);
    assert_eq!(field(&request, "messaging.operation"), "request");
    assert_eq!(field(&request, "messaging.operation.type"), "send");
    assert_eq!(field(&request, "otel.kind"), "producer");
    assert_eq!(field(&request, "ruststream.outcome"), "ok");
    let process = recorder()
        .wait_spans("process", &subject, 1)
        .await
        .remove(0);
    let audit = recorder().wait_spans("send", "spans.audit", 1).await;
    let audit = audit
        .iter()
        .find(|s| s.parent == Some(process.seq))
        .unwrap_or_else(|| panic!("the handler's publish is a child of its delivery: {audit:?}"));
    assert_eq!(field(audit, "messaging.operation"), "publish");
    let seen = recorder().0.lock().unwrap().spans.clone();
    let reply = seen
        .iter()
        .find(|s| {
            s.parent == Some(process.seq)
                && s.fields.get("messaging.operation").map(String::as_str) == Some("reply")
        })
        .unwrap_or_else(|| panic!("the reply is a child of the delivery: {seen:?}"));
    assert_eq!(field(reply, "ruststream.outcome"), "ok");
    running.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_handler_turns_down_is_one_warning_and_no_error() {
    let (broker, subject, running) = start_quote("spans.refuse").await;
    let err = Publisher::new(broker)
        .request::<_, u64>(&subject, &0, Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(matches!(err, ruststream::Error::Handler(_)), "{err:?}");
    let process = recorder()
        .wait_spans("process", &subject, 1)
        .await
        .remove(0);
    assert_eq!(field(&process, "ruststream.outcome"), "dead_lettered");
    let seen = recorder().0.lock().unwrap().events.clone();
    let about: Vec<_> = seen
        .iter()
        .filter(|e| e.scope.contains(&process.seq) && e.level <= Level::WARN)
        .collect();
    assert_eq!(about.len(), 1, "one log line at WARN or above: {about:?}");
    assert_eq!(about[0].level, Level::WARN, "{about:?}");
    running.shutdown().await.unwrap();
}
