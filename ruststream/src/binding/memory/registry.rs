//! Which receive queues a subject's messages go to: one per fan-out
//! subscription, one shared per queue group.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use super::queue::Queue;
use crate::Text;
use crate::binding::subject;

/// The queues one publish goes to, and the subject text deliveries carry.
pub(crate) struct Route {
    pub(crate) subject: Text,
    pub(crate) queues: Vec<Arc<Queue>>,
}

#[derive(Default)]
pub(crate) struct Registry {
    /// Subscriptions to exact subjects. Routes are shared snapshots so a
    /// publish clones one `Arc` under the read lock and nothing else.
    /// Fx hashing: subjects are the app's own names, and SipHash was a
    /// measurable share of every publish.
    exact: HashMap<Text, Arc<Route>>,
    /// Subscriptions with wildcards, matched one by one.
    patterns: Vec<Arc<Queue>>,
    /// Queue-group queues by (pattern, group).
    groups: HashMap<(Text, Text), Arc<Queue>>,
}

/// Where one publish goes.
pub(crate) enum Targets {
    Shared(Arc<Route>),
    Owned(Vec<Arc<Queue>>),
}

impl Targets {
    pub(crate) fn queues(&self) -> &[Arc<Queue>] {
        match self {
            Targets::Shared(route) => &route.queues,
            Targets::Owned(queues) => queues,
        }
    }
}

impl Registry {
    pub(crate) fn group(&self, pattern: &Text, group: &Text) -> Option<Arc<Queue>> {
        self.groups.get(&(pattern.clone(), group.clone())).cloned()
    }

    /// Adds a queue (new subscription or new group).
    pub(crate) fn insert(&mut self, queue: Arc<Queue>, group: Option<Text>) {
        if let Some(group) = group {
            self.groups
                .insert((queue.subject.clone(), group), Arc::clone(&queue));
        }
        if subject::is_pattern(&queue.subject) {
            self.patterns.push(queue);
            return;
        }
        let route = self.exact.entry(queue.subject.clone()).or_insert_with(|| {
            Arc::new(Route {
                subject: queue.subject.clone(),
                queues: Vec::new(),
            })
        });
        let mut queues = route.queues.clone();
        queues.push(queue);
        *route = Arc::new(Route {
            subject: route.subject.clone(),
            queues,
        });
    }

    /// Removes a queue whose last member left.
    pub(crate) fn remove(&mut self, queue: &Arc<Queue>) {
        self.groups.retain(|_, q| !Arc::ptr_eq(q, queue));
        self.patterns.retain(|q| !Arc::ptr_eq(q, queue));
        if let Some(route) = self.exact.get_mut(&queue.subject) {
            let queues: Vec<_> = route
                .queues
                .iter()
                .filter(|q| !Arc::ptr_eq(q, queue))
                .cloned()
                .collect();
            if queues.is_empty() {
                self.exact.remove(&queue.subject);
            } else {
                *route = Arc::new(Route {
                    subject: route.subject.clone(),
                    queues,
                });
            }
        }
    }

    /// The route of `subject` when no wildcard subscription exists, without
    /// cloning anything: `Err(())` when there are patterns to match (use
    /// [`targets`](Self::targets)).
    pub(crate) fn exact(&self, subject: &str) -> Result<Option<&Arc<Route>>, ()> {
        if self.patterns.is_empty() {
            Ok(self.exact.get(subject))
        } else {
            Err(())
        }
    }

    /// Every queue, once each.
    pub(crate) fn queues(&self) -> impl Iterator<Item = &Arc<Queue>> {
        self.exact
            .values()
            .flat_map(|route| route.queues.iter())
            .chain(self.patterns.iter())
    }

    /// Queues a message published to `subject` goes to.
    pub(crate) fn targets(&self, subject: &str) -> Option<Targets> {
        let exact = self.exact.get(subject);
        if self.patterns.is_empty() {
            return exact.map(|r| Targets::Shared(Arc::clone(r)));
        }
        let mut queues: Vec<Arc<Queue>> = exact.map(|r| r.queues.clone()).unwrap_or_default();
        queues.extend(
            self.patterns
                .iter()
                .filter(|q| subject::matches(&q.subject, subject))
                .cloned(),
        );
        (!queues.is_empty()).then_some(Targets::Owned(queues))
    }
}
