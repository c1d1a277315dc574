//! A subscriber that asks for a `retry_after` on its first run and sends
//! every envelope it sees to the test, and a process that crashes.

use std::time::Duration;

use ruststream::bytes::Bytes;
use ruststream::subscriber::{Outcome, Scope, SendSubscriber, Subscriber, SubscriberConfig};
use ruststream::{App, BoxError, Broker, Envelope, Json, MainRuntime, RunningApp};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Asks for a retry on its first run; records what comes back.
pub struct RetryOnce {
    pub config: SubscriberConfig,
    pub delay: Duration,
    pub seen: UnboundedSender<Envelope>,
}

impl Subscriber for RetryOnce {
    type Body = Bytes;
    type Codec = Json;

    fn config(&self) -> SubscriberConfig {
        self.config.clone()
    }

    fn decode(&self, payload: &Bytes) -> std::result::Result<Bytes, BoxError> {
        Ok(payload.clone())
    }

    fn handle(&self, body: Bytes, scope: &Scope<'_>) -> impl Future<Output = Outcome> {
        self.handle_send(body, scope)
    }
}

impl SendSubscriber for RetryOnce {
    fn handle_send(&self, _body: Bytes, scope: &Scope<'_>) -> impl Future<Output = Outcome> + Send {
        let env = scope.envelope().clone();
        if env.total_attempt() == 1 {
            scope.ctx::<MainRuntime>().retry_after(self.delay);
        }
        let _ = self.seen.send(env);
        std::future::ready(Outcome::Ack(None))
    }
}

/// An app running one [`RetryOnce`], with what its handler saw and the
/// deliveries it settled as done (`after_ack`).
pub struct RetryApp {
    pub running: RunningApp,
    pub seen: UnboundedReceiver<Envelope>,
    pub settled: UnboundedReceiver<Envelope>,
}

impl RetryApp {
    pub async fn start<B: Broker>(broker: B, config: SubscriberConfig, delay: Duration) -> Self {
        let (seen_tx, seen) = unbounded_channel();
        let (settled_tx, settled) = unbounded_channel();
        let running = App::new()
            .broker(broker)
            .after_ack(move |env: Envelope| {
                let _ = settled_tx.send(env);
                async {}
            })
            .subscriber(RetryOnce {
                config,
                delay,
                seen: seen_tx,
            })
            .start()
            .await
            .unwrap();
        RetryApp {
            running,
            seen,
            settled,
        }
    }
}

/// Runs `work` on a runtime of its own, in a thread of its own, then drops
/// that runtime: its tasks and connections die with it, as in a process
/// that crashed (no shutdown, no flush).
pub fn in_a_process_that_dies<T, F>(work: F) -> T
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(work)
    })
    .join()
    .expect("the dying process ran")
}
