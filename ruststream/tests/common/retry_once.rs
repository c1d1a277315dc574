//! A subscriber that asks for a `retry_after` on its first run and sends
//! every envelope it sees to the test.

use std::time::Duration;

use ruststream::bytes::Bytes;
use ruststream::{
    BoxError, Envelope, Json, MainRuntime, Outcome, Scope, SendSubscriber, Subscriber,
    SubscriberConfig,
};
use tokio::sync::mpsc::UnboundedSender;

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
