//! Settings from a TOML file and `RUSTSTREAM__…` variables (feature
//! `config`): the layering code < file < environment, errors that name the
//! key and where it came from, per-subscriber overrides that change how a
//! running app consumes, and a broker URL from the environment reaching a
//! real NATS server.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use common::{unique, within};
use ruststream::ingress::{JobQueueProfile, JobQueueSettings};
use ruststream::prelude::*;
use ruststream::settings::Settings;
use ruststream::{Error, SubscribeOptions, header};
use tokio::sync::Barrier;

const NO_VARS: [(&str, &str); 0] = [];

/// A settings file of the test's own.
fn file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique("ruststream-settings"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn config_error(result: ruststream::Result<Settings>) -> String {
    match result {
        Err(Error::Config(message)) => message,
        Err(other) => panic!("expected a configuration error, got {other}"),
        Ok(settings) => panic!("expected an error, got {settings:?}"),
    }
}

#[test]
fn the_environment_wins_over_the_file_which_wins_over_the_code() {
    let path = file(
        "layers.toml",
        "shutdown_timeout = \"30s\"\n[job_queue]\nprofile = \"small\"\nmax_queued_jobs = 100\n",
    );
    let settings = Settings::from_sources(
        Some(&path),
        [
            ("RUSTSTREAM__JOB_QUEUE__MAX_QUEUED_JOBS", "64"),
            ("RUSTSTREAM_NATS_URL", "not a setting: no double underscore"),
            ("PATH", "/usr/bin"),
        ],
    )
    .unwrap();
    assert_eq!(settings.shutdown_timeout(), Some(Duration::from_secs(30)));
    let code = JobQueueSettings::profile(JobQueueProfile::Large).pause_resume(90, 10);
    let jobs = settings.job_queue().apply(code);
    assert_eq!(jobs.get_profile(), JobQueueProfile::Small, "file over code");
    assert_eq!(jobs.effective_max(), 64, "environment over file");
    assert_eq!(jobs.percents(), (90, 10), "code where nothing else says");
}

#[test]
fn an_unknown_key_in_the_file_names_the_key_and_the_file() {
    let path = file("typo.toml", "[job_queue]\nmax_jobs = 5\n");
    let message = config_error(Settings::from_sources(Some(&path), NO_VARS));
    assert!(message.contains("`job_queue.max_jobs`"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains("max_queued_jobs"),
        "lists the valid keys: {message}"
    );
}

#[test]
fn an_unknown_variable_names_the_variable() {
    let message = config_error(Settings::from_sources(
        None,
        [("RUSTSTREAM__SUBSCRIBERS__CONFIRM__WORKRES", "4")],
    ));
    assert!(
        message.contains("`subscribers.confirm.workres`"),
        "{message}"
    );
    assert!(
        message.contains("environment variable RUSTSTREAM__SUBSCRIBERS__CONFIRM__WORKRES"),
        "{message}"
    );
}

#[test]
fn a_value_of_the_wrong_type_names_the_key_and_its_source() {
    let message = config_error(Settings::from_sources(
        None,
        [("RUSTSTREAM__SUBSCRIBERS__CONFIRM__WORKERS", "many")],
    ));
    assert!(
        message.contains("`subscribers.confirm.workers`"),
        "{message}"
    );
    assert!(
        message.contains("environment variable RUSTSTREAM__SUBSCRIBERS__CONFIRM__WORKERS"),
        "{message}"
    );

    let path = file("bad.toml", "shutdown_timeout = \"soon\"\n");
    let message = config_error(Settings::from_sources(Some(&path), NO_VARS));
    assert!(message.contains("`shutdown_timeout`"), "{message}");
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(
        message.contains("\"30s\""),
        "says what a duration looks like: {message}"
    );
}

#[test]
fn a_missing_file_is_an_error() {
    let path = std::env::temp_dir()
        .join(unique("no-such-settings"))
        .join("app.toml");
    let message = config_error(Settings::from_sources(Some(&path), NO_VARS));
    assert!(message.contains(&path.display().to_string()), "{message}");
}

#[subscriber("settings.parallel")]
async fn parallel(_job: Bytes, barrier: State<Barrier>) -> Result<(), HandlerError> {
    // Sequential by its code: three at once only with `workers = 3`.
    within(5, "three handlers at once", barrier.wait()).await;
    Ok(())
}

#[tokio::test]
async fn workers_from_the_settings_run_handlers_side_by_side() {
    let settings =
        Settings::from_sources(None, [("RUSTSTREAM__SUBSCRIBERS__PARALLEL__WORKERS", "3")])
            .unwrap();
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .state(Barrier::new(4))
        .subscriber(parallel)
        .settings(&settings)
        .start()
        .await
        .unwrap();
    for _ in 0..3 {
        broker
            .publish_message("settings.parallel", Message::new("job"), None)
            .await
            .unwrap();
    }
    // The fourth party: passes only when all three handlers wait at once.
    let barrier = running.handle().state::<Barrier>().unwrap();
    within(5, "three handlers side by side", barrier.wait()).await;
    running.shutdown().await.unwrap();
}

static FAILURES: AtomicU32 = AtomicU32::new(0);

#[subscriber("settings.failing", max_attempts = 5)]
async fn failing(_job: Bytes) -> Result<(), HandlerError> {
    FAILURES.fetch_add(1, Ordering::SeqCst);
    Err(HandlerError::retry("always"))
}

#[tokio::test]
async fn max_attempts_and_dead_letter_from_a_file_take_effect() {
    let path = file(
        "failing.toml",
        "[subscribers.failing]\nmax_attempts = 2\ndead_letter = \"settings.failing.dead\"\n",
    );
    let settings = Settings::from_sources(Some(&path), NO_VARS).unwrap();
    let broker = MemoryBroker::new();
    let mut dead = broker
        .subscribe(SubscribeOptions::new("settings.failing.dead"))
        .await
        .unwrap();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(failing)
        .settings(&settings)
        .start()
        .await
        .unwrap();
    broker
        .publish_message("settings.failing", Message::new("job"), None)
        .await
        .unwrap();
    let delivery = within(5, "the dead letter", dead.next()).await.unwrap();
    assert_eq!(
        delivery.envelope().headers().get(header::ATTEMPT),
        Some("2")
    );
    assert_eq!(
        FAILURES.load(Ordering::SeqCst),
        2,
        "two attempts, not the code's five"
    );
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_section_for_no_subscriber_stops_the_start_naming_its_source() {
    let path = file("unknown.toml", "[subscribers.confirm]\nworkers = 2\n");
    let settings = Settings::from_sources(Some(&path), NO_VARS).unwrap();
    let err = App::new()
        .broker(MemoryBroker::new())
        .subscriber(failing)
        .settings(&settings)
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("`subscribers.confirm`"), "{err}");
    assert!(err.contains(&path.display().to_string()), "{err}");
    assert!(
        err.contains("failing"),
        "lists the subscribers there are: {err}"
    );
}

#[tokio::test]
async fn a_broker_section_the_code_never_reads_is_an_error() {
    let settings =
        Settings::from_sources(None, [("RUSTSTREAM__BROKERS__NATZ__URL", "nats://x:1")]).unwrap();
    let _ = settings.broker("nats");
    let err = App::new()
        .broker(MemoryBroker::new())
        .settings(&settings)
        .check()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("`brokers.natz`"), "{err}");
    assert!(err.contains("RUSTSTREAM__BROKERS__NATZ"), "{err}");
    assert!(err.contains("it reads: nats"), "{err}");
}

#[test]
fn workers_and_threads_together_are_refused() {
    let settings = Settings::from_sources(
        None,
        [
            ("RUSTSTREAM__SUBSCRIBERS__FAILING__WORKERS", "2"),
            ("RUSTSTREAM__SUBSCRIBERS__FAILING__THREADS", "2"),
        ],
    )
    .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let err = runtime
        .block_on(
            App::new()
                .broker(MemoryBroker::new())
                .subscriber(failing)
                .settings(&settings)
                .check(),
        )
        .unwrap_err()
        .to_string();
    assert!(err.contains("not both"), "{err}");
}

/// The URL comes from the environment; the code's default points nowhere.
#[cfg(feature = "nats")]
#[tokio::test]
async fn a_broker_url_from_the_environment_reaches_nats() {
    let url =
        std::env::var("RUSTSTREAM_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let settings =
        Settings::from_sources(None, [("RUSTSTREAM__BROKERS__NATS__URL", url.as_str())]).unwrap();
    let nats = settings.broker("nats");
    let broker = ruststream::nats::NatsBroker::connect(nats.url_or("nats://127.0.0.1:1"))
        .await
        .unwrap_or_else(|err| {
            panic!("NATS is not reachable at {url}: {err}\nstart it with scripts/services.sh (or scripts/test.sh)")
        });
    let subject = unique("settings.nats");
    let mut subscription = broker
        .subscribe(SubscribeOptions::new(subject.as_str()))
        .await
        .unwrap();
    broker
        .publish_message(&subject, Message::new("over NATS"), None)
        .await
        .unwrap();
    let delivery = within(5, "a message over NATS", subscription.next())
        .await
        .unwrap();
    assert_eq!(delivery.envelope().payload(), "over NATS".as_bytes());
    broker.close().await.unwrap();
}

/// Batches seen by [`collect`].
#[derive(Default)]
struct Collected {
    batches: std::sync::Mutex<Vec<Vec<u32>>>,
    changed: tokio::sync::Notify,
}

#[subscriber("settings.batch", batch(max = 100, wait = "60s"))]
async fn collect(numbers: Vec<u32>, seen: ruststream::State<Collected>) {
    seen.batches.lock().unwrap().push(numbers);
    seen.changed.notify_one();
}

#[tokio::test]
async fn batch_size_and_wait_come_from_the_settings_for_a_batch_handler() {
    let settings = Settings::from_sources(
        None,
        [
            ("RUSTSTREAM__SUBSCRIBERS__COLLECT__BATCH_MAX", "2"),
            ("RUSTSTREAM__SUBSCRIBERS__COLLECT__BATCH_WAIT", "50ms"),
        ],
    )
    .unwrap();
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .state(Collected::default())
        .subscriber(collect)
        .settings(&settings)
        .start()
        .await
        .unwrap();
    for n in [1u32, 2, 3] {
        broker
            .publish_message("settings.batch", Message::new(n.to_string()), None)
            .await
            .unwrap();
    }
    let seen = running.handle().state::<Collected>().unwrap();
    // Full at two (not 100), and the third goes after 50 ms (not 60 s).
    within(10, "both batches", async {
        while seen.batches.lock().unwrap().concat().len() < 3 {
            seen.changed.notified().await;
        }
    })
    .await;
    let batches = seen.batches.lock().unwrap().clone();
    assert!(batches.iter().all(|b| b.len() <= 2), "{batches:?}");
    running.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_batch_size_for_a_handler_of_single_messages_stops_the_start() {
    let settings = Settings::from_sources(
        None,
        [("RUSTSTREAM__SUBSCRIBERS__FAILING__BATCH_MAX", "10")],
    )
    .unwrap();
    let err = App::new()
        .broker(MemoryBroker::new())
        .subscriber(failing)
        .settings(&settings)
        .start()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("`subscribers.failing.batch_max`"), "{err}");
    assert!(err.contains("applies to batch handlers"), "{err}");
    assert!(
        err.contains("RUSTSTREAM__SUBSCRIBERS__FAILING__BATCH_MAX"),
        "{err}"
    );
}

#[subscriber("local.counts", threads(2))]
async fn local_counts(_b: Bytes) {
    // `!Send` across the await: this handler runs on `threads(n)` only.
    let seen = std::rc::Rc::new(std::cell::Cell::new(0));
    tokio::task::yield_now().await;
    seen.set(seen.get() + 1);
}

#[subscriber("plain.work", workers(2))]
async fn plain_work(_b: Bytes) {}

/// `check` refuses whatever `start` would refuse — here two mistakes only
/// settings can make: a `!Send` handler moved off `threads(n)`, and a
/// `max_pending` on a subscriber that has no owner FIFOs for it to bound.
#[tokio::test]
async fn check_refuses_what_start_would_refuse() {
    for (vars, subscriber, says) in [
        (
            [("RUSTSTREAM__SUBSCRIBERS__LOCAL_COUNTS__WORKERS", "4")],
            "local_counts",
            "`!Send` handler",
        ),
        (
            [("RUSTSTREAM__SUBSCRIBERS__PLAIN_WORK__MAX_PENDING", "1")],
            "plain_work",
            "max_pending",
        ),
    ] {
        let settings = Settings::from_sources(None, vars).unwrap();
        let app = || {
            let app = App::new().broker(MemoryBroker::new());
            match subscriber {
                "local_counts" => app.subscriber(local_counts),
                _ => app.subscriber(plain_work),
            }
            .settings(&settings)
        };
        let checked = app().check().await.unwrap_err().to_string();
        assert!(checked.contains(says), "check: {checked}");
        let started = app().start().await.unwrap_err().to_string();
        assert_eq!(checked, started, "check and start say the same");
    }
}

/// Every key has an environment variable, text keys included when their
/// value looks like a number: a queue group named `007`.
#[tokio::test]
async fn a_text_setting_that_looks_like_a_number_stays_text() {
    let settings = Settings::from_sources(
        None,
        [
            ("RUSTSTREAM__SUBSCRIBERS__PLAIN_WORK__QUEUE_GROUP", "007"),
            ("RUSTSTREAM__SUBSCRIBERS__PLAIN_WORK__DEAD_LETTER", "true"),
        ],
    )
    .unwrap();
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(plain_work)
        .settings(&settings)
        .start()
        .await
        .unwrap();
    let queue = broker
        .queues()
        .into_iter()
        .find(|q| q.subject.as_str() == "plain.work")
        .expect("subscribed");
    assert_eq!(queue.queue_group.as_deref(), Some("007"), "kept as written");
    running.shutdown().await.unwrap();
}

mod billing {
    use ruststream::prelude::*;

    #[subscriber("billing.confirm")]
    pub async fn confirm(_b: Bytes) {}
}

mod shipping {
    use ruststream::prelude::*;

    #[subscriber("shipping.confirm")]
    pub async fn confirm(_b: Bytes) {}
}

/// Two handlers named alike: the bare name is refused as ambiguous, and
/// the module path tells them apart (`billing::confirm`, without the
/// crate name); a setting the handler cannot take names its key and file.
#[tokio::test]
async fn a_module_path_tells_apart_handlers_of_one_name() {
    let app = |settings: &Settings| {
        App::new()
            .broker(MemoryBroker::new())
            .subscriber(billing::confirm)
            .subscriber(shipping::confirm)
            .settings(settings)
    };
    let bare = file("bare.toml", "[subscribers.confirm]\nmax_attempts = 2\n");
    let settings = Settings::from_sources(Some(&bare), NO_VARS).unwrap();
    let err = app(&settings).check().await.unwrap_err().to_string();
    assert!(err.contains("names several subscribers"), "{err}");

    let pathed = file(
        "pathed.toml",
        "[subscribers.\"billing::confirm\"]\nmax_pending = 4\n",
    );
    let settings = Settings::from_sources(Some(&pathed), NO_VARS).unwrap();
    let err = app(&settings).check().await.unwrap_err().to_string();
    assert!(
        err.contains("`subscribers.billing::confirm.max_pending` in file")
            && err.contains("pathed.toml")
            && err.contains("workers(n, by_key)"),
        "the key, its file and why: {err}"
    );

    let fine = file(
        "fine.toml",
        "[subscribers.\"billing::confirm\"]\nworkers = 2\n",
    );
    let settings = Settings::from_sources(Some(&fine), NO_VARS).unwrap();
    app(&settings).check().await.unwrap();
}
