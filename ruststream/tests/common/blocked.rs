//! A subscriber built at run time (for subjects with a random suffix) whose
//! handler waits at a gate, then counts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use ruststream::bytes::Bytes;
use ruststream::subscriber::{Outcome, Scope, SendSubscriber, Subscriber, SubscriberConfig};
use ruststream::{BoxError, Json};

use super::Gate;

pub struct Blocked {
    pub config: SubscriberConfig,
    pub gate: Arc<Gate>,
    pub done: Arc<AtomicU32>,
}

impl Blocked {
    pub fn new(config: SubscriberConfig) -> Self {
        Blocked {
            config,
            gate: Arc::new(Gate::new()),
            done: Arc::new(AtomicU32::new(0)),
        }
    }
}

impl Subscriber for Blocked {
    type Body = Bytes;
    type Codec = Json;

    fn config(&self) -> SubscriberConfig {
        self.config.clone()
    }

    fn decode(&self, payload: &Bytes) -> Result<Bytes, BoxError> {
        Ok(payload.clone())
    }

    fn handle(&self, body: Bytes, scope: &Scope<'_>) -> impl Future<Output = Outcome> {
        self.handle_send(body, scope)
    }
}

impl SendSubscriber for Blocked {
    fn handle_send(
        &self,
        _body: Bytes,
        _scope: &Scope<'_>,
    ) -> impl Future<Output = Outcome> + Send {
        let gate = Arc::clone(&self.gate);
        let done = Arc::clone(&self.done);
        async move {
            gate.pass().await;
            done.fetch_add(1, Ordering::SeqCst);
            Outcome::Ack(None)
        }
    }
}
