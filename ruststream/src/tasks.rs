//! Tracked follow-up work of one delivery: `Ctx::and_after`
//! continuations and `Ctx::retry_after` redeliveries. Both start only after
//! the delivery is acked, run at most once, and are tracked by the app, so a
//! graceful shutdown waits for them.

use std::pin::Pin;
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::time::Instant;

use crate::binding::Broker;
use crate::host::AppHandle;
use crate::{Envelope, Message, Text};

type Continuation = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The follow-ups a handler asked for, shared between its [`Ctx`](crate::Ctx)
/// and the pipeline. Allocated only for handlers that take a `Ctx`.
pub(crate) struct FollowUps {
    pub(crate) app: AppHandle,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// `None` while the handler runs; then whether the delivery was acked.
    acked: Option<bool>,
    continuations: Vec<Continuation>,
    retry: Option<Duration>,
}

impl FollowUps {
    pub(crate) fn new(app: AppHandle) -> Self {
        FollowUps {
            app,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Runs `continuation` after the ack. Called after the delivery was
    /// already acked, it starts at once; after a failed delivery, never.
    pub(crate) fn and_after(&self, continuation: Continuation) {
        let mut state = self.lock();
        match state.acked {
            None => state.continuations.push(continuation),
            Some(true) => {
                drop(state);
                self.app.spawn(continuation);
            }
            Some(false) => {
                tracing::debug!("delivery was not acked: continuation dropped");
            }
        }
    }

    pub(crate) fn retry_after(&self, delay: Duration) {
        self.lock().retry = Some(delay);
    }

    pub(crate) fn retry_requested(&self) -> Option<Duration> {
        self.lock().retry
    }

    /// Continuations waiting for the ack (for tests).
    #[cfg(feature = "testing")]
    pub(crate) fn pending(&self) -> usize {
        self.lock().continuations.len()
    }

    /// Settles as acked and hands the continuations over instead of
    /// spawning them (for tests, which run them in place).
    #[cfg(feature = "testing")]
    pub(crate) fn take_pending(&self) -> Vec<Continuation> {
        let mut state = self.lock();
        state.acked = Some(true);
        std::mem::take(&mut state.continuations)
    }

    /// The delivery is settled: start the continuations if it was acked,
    /// drop them otherwise.
    pub(crate) fn settled(&self, acked: bool) {
        let continuations = {
            let mut state = self.lock();
            state.acked = Some(acked);
            std::mem::take(&mut state.continuations)
        };
        if acked {
            for continuation in continuations {
                self.app.spawn(continuation);
            }
        }
    }
}

/// Republishes `env`'s message to its subject after `delay`, counting one more
/// attempt, as a task the app tracks. At shutdown a pending timer does
/// not wait: it publishes at once with the remaining delay in a header, so the
/// next consumer re-arms it and nothing is lost.
pub(crate) fn schedule_retry<B: Broker>(
    broker: &B,
    app: &AppHandle,
    env: &Envelope,
    delay: Duration,
) {
    let broker = broker.clone();
    let flush = app.flush_retries().clone();
    let env = env.clone();
    let name: Box<str> = app.metrics().app().into();
    app.spawn(async move {
        let due = Instant::now() + delay;
        tokio::select! {
            () = tokio::time::sleep_until(due) => {}
            () = flush.cancelled() => {}
        }
        let remaining = due.saturating_duration_since(Instant::now());
        let message = env.retry_copy(remaining);
        republish(&broker, &name, env.subject(), message).await;
    });
}

async fn republish<B: Broker>(broker: &B, app: &str, subject: &Text, message: Message) {
    if let Err(err) = broker.publish_message(subject, message, None).await {
        crate::metrics::retry_lost(app, subject);
        tracing::error!(subject = %subject, error = %err, "retry_after republish failed");
    }
}
