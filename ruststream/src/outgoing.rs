//! Publish-side middleware: hooks that see every message the app sends —
//! publishes and requests from handlers and from the app's publishers, and
//! the replies handlers return — just before it goes to the broker.

use std::sync::Arc;

use crate::Message;

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

/// The app's hooks, in the order added; empty costs one branch per send.
#[derive(Clone, Default)]
pub(crate) struct Outgoing(Option<Arc<[Arc<dyn OnPublish>]>>);

impl Outgoing {
    pub(crate) fn new(hooks: Vec<Arc<dyn OnPublish>>) -> Self {
        Outgoing((!hooks.is_empty()).then(|| hooks.into()))
    }

    /// Runs the hooks on `message`, in place (a send without hooks moves
    /// nothing).
    #[inline]
    pub(crate) fn apply(&self, subject: &str, message: &mut Message) {
        if let Some(hooks) = &self.0 {
            run(hooks, subject, message);
        }
    }
}

#[inline(never)]
fn run(hooks: &[Arc<dyn OnPublish>], subject: &str, message: &mut Message) {
    for hook in hooks {
        hook.on_publish(subject, message);
    }
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hooks = self.0.as_ref().map_or(0, |h| h.len());
        f.debug_struct("Outgoing").field("hooks", &hooks).finish()
    }
}
