//! `threads(n)` (RT-5): `n` OS threads, each with its own current-thread Tokio
//! runtime, fed by a task on the app runtime through rings of 8 slots. The
//! feeder takes a delivery from the broker only when a ring has a free slot,
//! so read-ahead never exceeds `n × 9` (8 in the ring, 1 in hand). A thread
//! runs the whole delivery, decode to ack, on its own runtime; the handler
//! future may therefore be `!Send`.
//!
//! With `by_key`, the feeder decodes (to compute the key) and routes every
//! key to one thread, so a key's deliveries run in arrival order; it waits
//! until every ring has a free slot before taking a delivery, keeping the
//! same bound.

use std::pin::pin;
use std::sync::Arc;

use tokio::sync::{Notify, oneshot};

use super::ring::Ring;
use super::sequential::next;
use super::slot;
use super::stop::Stop;
use crate::binding::{Broker, Delivery, Subscription};
use crate::pipeline::Unit;
use crate::subscriber::Subscriber;

/// What a thread is handed: a raw delivery, or one the feeder already decoded
/// (by-key routing).
enum Job<D, Body> {
    Raw(D),
    Decoded(D, Body),
}

type JobOf<B, S> =
    Job<<<B as Broker>::Subscription as Subscription>::Delivery, <S as Subscriber>::Body>;

struct Rings<T> {
    rings: Vec<Ring<T>>,
    /// The feeder waits here for a free slot; threads notify after each pop.
    space: Notify,
}

impl<T> Rings<T> {
    /// A ring with a free slot (round robin from `cursor`), or — with `all` —
    /// the moment every ring has one.
    async fn wait_space(&self, all: bool, cursor: &mut usize) -> usize {
        let n = self.rings.len();
        loop {
            let mut space = pin!(self.space.notified());
            space.as_mut().enable();
            if all {
                if self.rings.iter().all(Ring::has_space) {
                    return 0;
                }
            } else if let Some(i) = (0..n)
                .map(|k| (*cursor + k) % n)
                .find(|&i| self.rings[i].has_space())
            {
                *cursor = (i + 1) % n;
                return i;
            }
            space.await;
        }
    }
}

pub(crate) async fn run<B: Broker, S: Subscriber>(
    unit: Arc<Unit<B, S>>,
    mut subscription: B::Subscription,
    stop: Stop,
    n: usize,
    by_key: bool,
) {
    let rings: Arc<Rings<JobOf<B, S>>> = Arc::new(Rings {
        rings: (0..n).map(|_| Ring::new()).collect(),
        space: Notify::new(),
    });
    let mut finished = Vec::with_capacity(n);
    for index in 0..n {
        let (done, finished_rx) = oneshot::channel::<()>();
        finished.push(finished_rx);
        let thread_unit = Arc::clone(&unit);
        let rings = Arc::clone(&rings);
        let name = format!("ruststream-thread-{index}");
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(thread_loop(&thread_unit, &rings, index)),
                Err(err) => {
                    tracing::error!(error = %err, "cannot start a dedicated thread's runtime")
                }
            }
            // Dropping `done` (also on a panic) tells the app this thread ended.
            drop(done);
        });
        if let Err(err) = spawned {
            tracing::error!(subject = %unit.config.subject, error = %err, "cannot spawn a dedicated thread");
        }
    }

    let mut cursor = 0;
    loop {
        let target = tokio::select! {
            biased;
            target = rings.wait_space(by_key, &mut cursor) => target,
            () = stop.wait() => break,
        };
        let Some(delivery) = next(&mut subscription, &stop).await else {
            break;
        };
        if by_key {
            let Some((delivery, body)) = unit.prepare(delivery).await else {
                continue;
            };
            let key = unit.subscriber.key(&body, delivery.envelope());
            rings.rings[slot(key, n)].push(Job::Decoded(delivery, body));
        } else {
            rings.rings[target].push(Job::Raw(delivery));
        }
    }
    // Threads drain their rings (deliveries in hand are processed and
    // settled), then end.
    for ring in &rings.rings {
        ring.close();
    }
    for thread in finished {
        let _ = thread.await;
    }
}

async fn thread_loop<B: Broker, S: Subscriber>(
    unit: &Unit<B, S>,
    rings: &Rings<JobOf<B, S>>,
    index: usize,
) {
    let ring = &rings.rings[index];
    while let Some(job) = ring.pop().await {
        rings.space.notify_one();
        match job {
            Job::Raw(delivery) => unit.process_local(delivery).await,
            Job::Decoded(delivery, body) => unit.invoke_local(delivery, body).await,
        }
    }
}
