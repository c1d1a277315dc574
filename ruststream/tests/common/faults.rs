//! What the fault suites (`tests/faults_*.rs`) share: the app under test —
//! a subscriber that says what it handles — run in the test process or as
//! a process of its own that a test kills, or that kills itself; and the
//! messages a poison test expects to see dead-lettered.
//!
//! The app process is the test binary itself, run again with only its
//! ignored `app_process` test and told what to do by environment variables
//! ([`AppSpec`]). It prints `handling <id> <attempt>` when a handler starts
//! and `handled <id>` when it is done; the test reads those lines.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use ruststream::bytes::Bytes;
use ruststream::codec::Decode;
use ruststream::subscriber::{Outcome, Scope, SendSubscriber, Subscriber, SubscriberConfig};
use ruststream::{App, BoxError, Broker, Envelope, Json, Message, RunningApp};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::within;

/// The body every fault test publishes: JSON with an id.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Job {
    pub id: String,
}

/// A job's JSON payload.
pub fn job(id: &str) -> Vec<u8> {
    serde_json::to_vec(&Job { id: id.to_owned() }).unwrap()
}

/// What the app under test does with a job.
#[derive(Clone, Debug)]
pub enum Behaviour {
    /// Handles every job.
    Handle,
    /// Never settles a job: the handler waits forever (a test kills the
    /// process with the jobs in flight).
    Hold,
    /// Takes a few milliseconds per job, so jobs queue up behind it, and
    /// finishes only with a permit of the gate: the test decides how many
    /// jobs end before it stops the app, however fast the handlers run.
    Gated(Arc<Semaphore>),
}

/// The subscriber of the app under test. A job whose id starts with
/// `crash` aborts the process, every time.
pub struct Recorder {
    pub config: SubscriberConfig,
    pub behaviour: Behaviour,
    /// Where (id, attempt) goes as a handler starts; `None`: to stdout.
    pub seen: Option<UnboundedSender<(String, u32)>>,
}

impl Subscriber for Recorder {
    type Body = Job;
    type Codec = Json;

    fn config(&self) -> SubscriberConfig {
        self.config.clone()
    }

    fn decode(&self, payload: &Bytes) -> Result<Job, BoxError> {
        Json::decode(payload)
    }

    fn handle(&self, body: Job, scope: &Scope<'_>) -> impl Future<Output = Outcome> {
        self.handle_send(body, scope)
    }
}

impl SendSubscriber for Recorder {
    fn handle_send(&self, job: Job, scope: &Scope<'_>) -> impl Future<Output = Outcome> + Send {
        let attempt = scope.envelope().total_attempt();
        match &self.seen {
            Some(seen) => {
                let _ = seen.send((job.id.clone(), attempt));
            }
            None => println!("handling {} {attempt}", job.id),
        }
        if job.id.starts_with("crash") {
            std::process::abort();
        }
        let behaviour = self.behaviour.clone();
        let to_stdout = self.seen.is_none();
        async move {
            match behaviour {
                Behaviour::Hold => std::future::pending::<()>().await,
                Behaviour::Gated(gate) => {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    gate.acquire().await.expect("the gate stays open").forget();
                }
                Behaviour::Handle => {}
            }
            if to_stdout {
                println!("handled {}", job.id);
            }
            Outcome::Ack(None)
        }
    }
}

/// Starts an app with one [`Recorder`] on `broker`, reporting to `seen`.
pub async fn start_app<B: Broker>(
    broker: B,
    config: SubscriberConfig,
    seen: UnboundedSender<(String, u32)>,
) -> RunningApp {
    App::new()
        .broker(broker)
        .subscriber(Recorder {
            config,
            behaviour: Behaviour::Handle,
            seen: Some(seen),
        })
        .start()
        .await
        .unwrap()
}

/// The environment variable that makes `app_process` run the app.
const SPEC: &str = "RUSTSTREAM_FAULT_APP";

/// What an app process runs: the broker's URL, the subscriber, and the
/// broker binding's own settings (`extra`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AppSpec {
    pub url: String,
    pub subject: String,
    pub group: String,
    pub dead_letter: Option<String>,
    pub max_attempts: u32,
    pub hold: bool,
    /// `workers(n)` when more than 1; the default loop otherwise.
    pub workers: usize,
    pub extra: BTreeMap<String, String>,
}

impl AppSpec {
    pub fn new(url: &str, subject: &str, group: &str) -> Self {
        AppSpec {
            url: url.to_owned(),
            subject: subject.to_owned(),
            group: group.to_owned(),
            dead_letter: None,
            max_attempts: 3,
            hold: false,
            workers: 1,
            extra: BTreeMap::new(),
        }
    }

    /// The spec `app_process` was started with; `None` when the test
    /// harness runs it on its own (with `--include-ignored`).
    pub fn from_env() -> Option<AppSpec> {
        let spec = std::env::var(SPEC).ok()?;
        Some(serde_json::from_str(&spec).expect("a fault app spec"))
    }

    /// The subscriber config the spec describes.
    pub fn config(&self) -> SubscriberConfig {
        let mut config = SubscriberConfig::new(self.subject.as_str())
            .queue_group(self.group.as_str())
            .max_attempts(self.max_attempts);
        if let Some(dead) = &self.dead_letter {
            config = config.dead_letter(dead.as_str());
        }
        if self.workers > 1 {
            config = config.workers(self.workers);
        }
        config
    }

    /// Runs the app on `broker` until the process is killed (or kills
    /// itself): the body of `app_process`.
    pub fn serve<B: Broker, F: Future<Output = B>>(&self, broker: impl FnOnce() -> F) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let _running = App::new()
                .broker(broker().await)
                .subscriber(Recorder {
                    config: self.config(),
                    behaviour: if self.hold {
                        Behaviour::Hold
                    } else {
                        Behaviour::Handle
                    },
                    seen: None,
                })
                .start()
                .await
                .unwrap();
            println!("ready");
            std::future::pending::<()>().await
        })
    }
}

/// The app under test as a process of its own.
pub struct AppProcess {
    child: tokio::process::Child,
    lines: UnboundedReceiver<String>,
    /// Lines printed but passed over by `expect`.
    passed: Vec<String>,
}

impl AppProcess {
    /// Runs this test binary's `app_process` with `spec`, and waits until
    /// its app has started.
    pub async fn start(spec: &AppSpec) -> AppProcess {
        let exe = std::env::current_exe().unwrap();
        let mut child = tokio::process::Command::new(exe)
            .args(["app_process", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads=1", "-q"])
            .env(SPEC, serde_json::to_string(spec).unwrap())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("the test binary runs again as the app process");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = unbounded_channel();
        tokio::spawn(async move {
            let mut reader = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut app = AppProcess {
            child,
            lines,
            passed: Vec::new(),
        };
        app.expect("ready", 20).await;
        app
    }

    /// The first line not taken yet that starts with `prefix`, waiting for
    /// the app to print it. Lines passed over stay for later calls.
    pub async fn expect(&mut self, prefix: &str, secs: u64) -> String {
        if let Some(at) = self.passed.iter().position(|l| l.starts_with(prefix)) {
            return self.passed.remove(at);
        }
        let what = format!("the app process to print `{prefix}…`");
        within(secs, &what, async {
            loop {
                match self.lines.recv().await {
                    Some(line) if line.starts_with(prefix) => return line,
                    Some(line) => self.passed.push(line),
                    None => panic!("the app process ended before printing `{prefix}…`"),
                }
            }
        })
        .await
    }

    /// Kills the process (SIGKILL, by its pid) and waits for it to go.
    pub async fn kill(mut self) {
        self.child.start_kill().unwrap();
        within(10, "the killed app process to exit", self.child.wait())
            .await
            .unwrap();
    }

    /// Waits for the process to end on its own; true when it was killed
    /// by a signal (an abort), not an exit.
    pub async fn aborted(mut self, secs: u64) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let status = within(secs, "the app process to end", self.child.wait())
            .await
            .unwrap();
        status.signal().is_some()
    }
}

/// Poison a test publishes, and what must become of it: dead-lettered
/// with a reason containing `reason`.
pub struct Poison {
    pub name: &'static str,
    pub reason: &'static str,
}

/// The poison payloads every broker gets (over a `max_message_size` of
/// 32 KiB), each with what must become of it.
pub fn poison_payloads() -> Vec<(Vec<u8>, Poison)> {
    let poison = |name, reason| Poison { name, reason };
    vec![
        (
            b"{not json".to_vec(),
            poison("invalid JSON", "key must be a string"),
        ),
        (
            br#"{"name":"wrong shape"}"#.to_vec(),
            poison("wrong shape", "unknown field `name`"),
        ),
        (Vec::new(), poison("empty body", "EOF while parsing")),
        (
            vec![b'x'; 70_000],
            poison("oversize body", "exceeds max_message_size"),
        ),
    ]
}

/// What a message with thousands of headers (over 32 KiB in all) must
/// become.
pub fn many_headers() -> Poison {
    Poison {
        name: "3,000 headers",
        reason: "exceeds max_message_size",
    }
}

/// Waits for `count` deliveries on `seen`, and returns them by id.
pub async fn handled(
    seen: &mut UnboundedReceiver<(String, u32)>,
    count: usize,
    secs: u64,
) -> BTreeMap<String, Vec<u32>> {
    let mut by_id: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    within(secs, &format!("{count} handler runs"), async {
        for _ in 0..count {
            let (id, attempt) = seen.recv().await.unwrap();
            by_id.entry(id).or_default().push(attempt);
        }
    })
    .await;
    by_id
}

/// Checks that a dead letter's reason (`ruststream-error`) matches one
/// poison of `expected` and removes it; panics on a stranger.
pub fn dead_lettered(expected: &mut Vec<Poison>, env: &Envelope) {
    let reason = env
        .headers()
        .get(ruststream::header::ERROR)
        .unwrap_or_default()
        .to_owned();
    let payload = String::from_utf8_lossy(&env.payload()[..env.payload().len().min(40)]);
    let at = expected
        .iter()
        .position(|p| reason.contains(p.reason))
        .unwrap_or_else(|| {
            panic!("an unexpected dead letter: reason {reason:?}, payload {payload:?}")
        });
    let poison = expected.remove(at);
    eprintln!("dead-lettered {}: {reason}", poison.name);
}

/// A bounded quiet window: how long a test watches for something that
/// must not happen.
pub const QUIET: Duration = Duration::from_millis(500);

/// What a broker restart mid-stream did.
pub struct MidStream {
    /// Handler runs beyond the first, over all jobs.
    pub duplicates: usize,
    /// From the server being back to the first job handled after it.
    pub resumed: Duration,
    /// From the server being back to every job handled.
    pub recovered: Duration,
}

/// Runs an app on `broker` for group `workers` on `subject`, publishes `n`
/// jobs (each again until the broker confirms it: a failed publish may
/// have been stored, and then counts twice), calls `restart` a quarter of
/// the way through, and waits until every job was handled at least once.
pub async fn restart_mid_stream<B: Broker, F: Future<Output = ()>>(
    broker: B,
    subject: &str,
    n: usize,
    restart: F,
) -> MidStream {
    let (seen_tx, mut seen) = unbounded_channel();
    let config = SubscriberConfig::new(subject).queue_group("workers");
    let running = start_app(broker.clone(), config, seen_tx).await;
    let publisher = tokio::spawn({
        let subject = subject.to_owned();
        async move {
            for i in 0..n {
                let publish = || {
                    let message = Message::new(job(&i.to_string()));
                    broker.publish_message(&subject, message, None)
                };
                while publish().await.is_err() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let mut runs: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..n / 4 {
        one_run(&mut seen, &mut runs, "jobs before the kill", 10).await;
    }
    restart.await;
    let back = std::time::Instant::now();
    one_run(&mut seen, &mut runs, "the first job after the restart", 60).await;
    let resumed = back.elapsed();
    within(120, "every publish", publisher).await.unwrap();
    while runs.len() < n {
        let missing: Vec<String> = (0..n)
            .map(|i| i.to_string())
            .filter(|id| !runs.contains_key(id))
            .collect();
        let what = format!("every job after the restart (not handled yet: {missing:?})");
        one_run(&mut seen, &mut runs, &what, 60).await;
    }
    let recovered = back.elapsed();
    running.shutdown().await.unwrap();
    MidStream {
        duplicates: runs.values().map(|n| n - 1).sum(),
        resumed,
        recovered,
    }
}

/// Counts the next handler run in `runs`.
async fn one_run(
    seen: &mut UnboundedReceiver<(String, u32)>,
    runs: &mut BTreeMap<String, usize>,
    what: &str,
    secs: u64,
) {
    let (id, _) = within(secs, what, seen.recv()).await.unwrap();
    *runs.entry(id).or_default() += 1;
}

/// Kills an app process holding `n` jobs (four in its handlers, the rest
/// read ahead), then checks that the next instance handles them all.
/// `publish(i)` publishes job `i`; with `before`, all are published before
/// the first app starts (so its first read takes them all).
pub async fn killed_in_flight<F: Future<Output = ()>>(
    mut spec: AppSpec,
    n: usize,
    before: bool,
    publish: impl Fn(usize) -> F,
) {
    let publish_all = async || {
        for i in 0..n {
            publish(i).await;
        }
    };
    if before {
        publish_all().await;
    }
    spec.hold = true;
    spec.workers = 4;
    let mut first = AppProcess::start(&spec).await;
    if !before {
        publish_all().await;
    }
    for _ in 0..4 {
        first.expect("handling ", 10).await;
    }
    first.kill().await;

    spec.hold = false;
    let mut second = AppProcess::start(&spec).await;
    let mut handled = BTreeSet::new();
    while handled.len() < n {
        let line = second.expect("handled ", 30).await;
        handled.insert(line["handled ".len()..].to_owned());
    }
    second.kill().await;
}

/// A crash loop: app processes of `spec` (which has a dead letter and
/// `max_attempts` 3) get jobs `good-a`, `crash-1`, `good-b` (published by
/// `publish` once the first is up); `crash-1` aborts each instance that
/// runs it. Ends with the first dead letter on `dead` (payload and
/// reason), which must be `crash-1`'s, after exactly three crashes; both
/// good jobs are handled and no other dead letter follows. Returns the
/// reason.
pub async fn crash_loop<P: Future<Output = ()>>(
    spec: &AppSpec,
    publish: impl FnOnce() -> P,
    dead: &mut UnboundedReceiver<(Vec<u8>, String)>,
) -> String {
    let mut app = AppProcess::start(spec).await;
    publish().await;
    let mut crashes = 0;
    let mut handled = BTreeSet::new();
    let (payload, reason) = loop {
        let line = tokio::select! {
            line = app.expect("handl", 30) => line,
            letter = dead.recv() => break letter.unwrap(),
        };
        match line.strip_prefix("handled ") {
            Some(id) => {
                handled.insert(id.to_owned());
            }
            None if line.starts_with("handling crash-1") => {
                crashes += 1;
                assert!(
                    app.aborted(10).await,
                    "{line}: the handler aborted the process"
                );
                assert!(crashes <= 3, "the crash loop went on past max_attempts");
                app = AppProcess::start(spec).await;
            }
            None => {}
        }
    };
    assert_eq!(crashes, 3, "three runs, then the dead letter");
    assert_eq!(payload, job("crash-1"), "the crash job is the dead letter");
    while handled.len() < 2 {
        let line = app.expect("handled ", 30).await;
        handled.insert(line["handled ".len()..].to_owned());
    }
    assert_eq!(
        handled,
        BTreeSet::from(["good-a".to_owned(), "good-b".to_owned()])
    );
    tokio::time::sleep(QUIET).await;
    assert!(
        dead.try_recv().is_err(),
        "no other dead letter: the jobs around it are not exhausted with it"
    );
    app.kill().await;
    eprintln!("crash loop: {crashes} crashed instances, then the dead letter: {reason}");
    reason
}

/// A graceful stop mid-stream (RT-9): an app whose handler takes a few
/// milliseconds per job starts on `n` jobs (published to its subject by
/// `publisher` once it is up) and is shut down after a few (only five
/// finish before the stop begins: see [`Behaviour::Gated`]), with the rest
/// at the broker or read ahead; a second app on a fresh connection
/// (`connect`) gets exactly the rest. Nothing the first one handled comes
/// back: every ack it made reached the broker before its connection closed.
pub async fn stopped_mid_stream<B, C>(
    connect: impl Fn() -> C,
    publisher: &impl Broker,
    config: SubscriberConfig,
    n: usize,
) where
    B: Broker,
    C: Future<Output = B>,
{
    let (seen_tx, mut seen) = unbounded_channel();
    // Five jobs may finish before the stop begins, however fast the
    // handlers run; the gate opens with its first step, and the ones in
    // hand then finish during it (handled, so they must be acked).
    let gate = Arc::new(Semaphore::new(5));
    let opener = Arc::clone(&gate);
    let running = App::new()
        .broker(connect().await)
        .subscriber(Recorder {
            config: config.clone(),
            behaviour: Behaviour::Gated(gate),
            seen: Some(seen_tx),
        })
        .on_shutdown(move |_| async move {
            opener.add_permits(Semaphore::MAX_PERMITS - 5);
            Ok(())
        })
        .start()
        .await
        .unwrap();
    for i in 0..n {
        let job = Message::new(job(&i.to_string()));
        publisher
            .publish_message(config.subject().as_str(), job, None)
            .await
            .unwrap();
    }
    let mut first = BTreeSet::new();
    while first.len() < 5 {
        let (id, _) = within(10, "a few jobs handled", seen.recv()).await.unwrap();
        first.insert(id);
    }
    // Handlers in hand finish (and ack) before the brokers close.
    running.shutdown().await.unwrap();
    while let Ok((id, _)) = seen.try_recv() {
        first.insert(id);
    }
    assert!(first.len() < n, "the stop came before the last job");

    let (seen_tx, mut seen) = unbounded_channel();
    let running = start_app(connect().await, config, seen_tx).await;
    let mut second = BTreeSet::new();
    while first.len() + second.len() < n {
        // What the first app read ahead and never handled goes back when
        // it stops (or after the broker's redelivery timeout, which the
        // tests set below this bound).
        let (id, _) = within(10, "the jobs the first app left", seen.recv())
            .await
            .unwrap();
        assert!(
            !first.contains(&id),
            "job {id} was handled before the stop and delivered again"
        );
        second.insert(id);
    }
    running.shutdown().await.unwrap();
}
