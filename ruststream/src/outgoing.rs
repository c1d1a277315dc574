//! Everything that happens to a message on its way out, just before it goes
//! to the broker: the app's publish hooks, the send's span and trace
//! context, its latency metric. Publishes and requests from handlers and
//! from publishers, and the replies handlers return, all pass here.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tracing::Instrument;

use crate::spans::{self, Op};
use crate::{Error, Message, Result};

/// A hook on every outgoing message (see
/// [`App::on_publish`](crate::App::on_publish)); implemented for every
/// `Fn(&str, &mut Message)`: the subject it goes to, and the message to
/// change.
pub trait OnPublish: Send + Sync + 'static {
    /// Looks at, or changes, one outgoing `message` to `subject`.
    fn on_publish(&self, subject: &str, message: &mut Message);
}

impl<F: Fn(&str, &mut Message) + Send + Sync + 'static> OnPublish for F {
    fn on_publish(&self, subject: &str, message: &mut Message) {
        self(subject, message)
    }
}

/// What an app (or a publisher made outside one) does to the messages it
/// sends; `None` — no hooks, no spans, no timings — costs one branch per
/// send.
#[derive(Clone, Default)]
pub(crate) struct Outgoing(Option<Arc<Observed>>);

pub(crate) struct Observed {
    /// The app's hooks, in the order added.
    hooks: Box<[Arc<dyn OnPublish>]>,
    /// A span per send: a tracing subscriber wanted them when this was made.
    traced: bool,
    /// The send latency histograms (`metrics::record_handler_timings`).
    timed: bool,
    /// Their `app` label.
    app: Arc<str>,
}

impl Outgoing {
    /// An app's: its hooks, and spans and timings if they are wanted now.
    pub(crate) fn new(app: &str, hooks: Vec<Arc<dyn OnPublish>>) -> Self {
        let traced = spans::enabled();
        let timed = crate::metrics::timings_on();
        Outgoing((!hooks.is_empty() || traced || timed).then(|| {
            Arc::new(Observed {
                hooks: hooks.into(),
                traced,
                timed,
                app: app.into(),
            })
        }))
    }

    /// A publisher's made outside an app: spans and timings only.
    pub(crate) fn standalone() -> Self {
        Outgoing::new("", Vec::new())
    }

    /// What to do beyond sending; `None`: nothing.
    #[inline]
    pub(crate) fn observed(&self) -> Option<&Observed> {
        self.0.as_deref()
    }
}

impl Observed {
    /// Runs the hooks on `message`, in place, and starts observing the send
    /// when spans or timings are on: its span is then in the message's trace
    /// context. `system` is the broker's name.
    #[inline(never)]
    pub(crate) fn apply(
        &self,
        op: Op,
        system: &'static str,
        subject: &str,
        message: &mut Message,
    ) -> Option<Sending> {
        for hook in &self.hooks {
            hook.on_publish(subject, message);
        }
        if !self.traced && !self.timed {
            return None;
        }
        Some(Sending {
            span: self
                .traced
                .then(|| spans::send(op, system, subject, message)),
            timed: self.timed.then(|| (Instant::now(), Arc::clone(&self.app))),
            op,
            system,
        })
    }
}

/// One send being observed: its span, its start.
pub(crate) struct Sending {
    span: Option<tracing::Span>,
    timed: Option<(Instant, Arc<str>)>,
    op: Op,
    system: &'static str,
}

impl Sending {
    /// Runs the broker's `send` inside the span and records how it ended.
    pub(crate) async fn observe<T>(self, send: impl Future<Output = Result<T>>) -> Result<T> {
        let result = match &self.span {
            Some(span) => send.instrument(span.clone()).await,
            None => send.await,
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(Error::Timeout(_)) => "timeout",
            Err(_) => "error",
        };
        if let Some(span) = &self.span {
            spans::outcome(span, outcome);
        }
        if let Some((started, app)) = self.timed {
            crate::metrics::sent(self.op, self.system, &app, outcome, started.elapsed());
        }
        result
    }
}

/// Sends `$message` through `$outgoing` (an [`Outgoing`]): `$send` is the
/// broker operation on it, `$system` the broker's name (evaluated only when
/// observed). Without hooks, spans or timings it is the broker operation
/// alone, awaited in place.
macro_rules! send {
    ($outgoing:expr, $op:ident, $system:expr, $subject:expr, $message:ident, $send:expr) => {{
        #[allow(unused_mut)]
        let mut $message = $message;
        let observed = $outgoing.observed();
        match observed
            .and_then(|o| o.apply($crate::spans::Op::$op, $system, $subject, &mut $message))
        {
            None => $send.await,
            Some(sending) => ::std::boxed::Box::pin(sending.observe($send)).await,
        }
    }};
}
pub(crate) use send;

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = f.debug_struct("Outgoing");
        if let Some(observed) = &self.0 {
            out.field("hooks", &observed.hooks.len())
                .field("traced", &observed.traced)
                .field("timed", &observed.timed);
        }
        out.finish()
    }
}
