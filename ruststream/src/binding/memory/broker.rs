//! The memory broker behind the [`Broker`] seam: subscribe, publish, close.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::member_flow::MemberFlow;
use super::queue::Queue;
use super::{Deadline, MemoryBroker, MemorySubscription};
use crate::binding::{Broker, SubscribeOptions};
use crate::{Message, Result, Text};

impl Broker for MemoryBroker {
    fn as_requester(&self) -> Option<&dyn crate::binding::DynRequester> {
        Some(self)
    }

    type Subscription = MemorySubscription;

    fn name(&self) -> &'static str {
        "memory"
    }

    async fn subscribe(&self, options: SubscribeOptions) -> Result<MemorySubscription> {
        self.ensure_open()?;
        let mut registry = self.inner.registry_write();
        let existing = options
            .queue_group
            .as_ref()
            .and_then(|g| registry.group(&options.subject, g));
        let queue = match existing {
            Some(queue) => queue,
            None => {
                let queue = Arc::new(Queue::new(
                    self.inner.next_queue.fetch_add(1, Ordering::Relaxed),
                    Text::from(format!("{}L", self.inner.inbox.prefix())),
                    options.subject.clone(),
                    options.queue_group.clone(),
                    options.dead_letter.clone(),
                    self.inner.budget,
                    self.inner.round,
                    Arc::clone(&self.inner.shared),
                    Arc::downgrade(&self.inner),
                ));
                registry.insert(Arc::clone(&queue), options.queue_group.clone());
                queue
            }
        };
        // A member that starts paused joins paused, in one step (JQ-17).
        let paused = options.receive_flow && options.start_paused;
        queue.join(paused);
        let flow = options
            .receive_flow
            .then(|| Arc::new(MemberFlow::new(Arc::clone(&queue), paused)));
        Ok(MemorySubscription {
            flow,
            queue,
            broker: Arc::downgrade(&self.inner),
            conn: Arc::clone(&self.conn),
        })
    }

    // Not an `async fn`: the publish future itself, with no wrapper around it.
    #[inline]
    fn publish_message(
        &self,
        subject: &str,
        message: Message,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Result<()>> + Send {
        let deadline = match deadline {
            Some(at) => Deadline::At(at),
            None => Deadline::After(self.inner.publish_timeout),
        };
        self.inner
            .publish(Some(&self.conn), subject, message, deadline)
    }

    /// Closes this connection: its subscriptions end (their queues keep
    /// serving other connections' members), and its publishes fail with
    /// `Closed`. Other connections to the same server are not affected.
    async fn close(&self) -> Result<()> {
        if !self.conn.closed.swap(true, Ordering::AcqRel) {
            // Consumers wait on their queue alone: wake them all to look at
            // their connection (other connections' go back to waiting).
            for queue in self.inner.registry_read().queues() {
                queue.wake_readers();
            }
            // Its waiting publishes look at it too, and end.
            self.inner.shared.space.notify_waiters();
        }
        Ok(())
    }
}
