//! `workers(n)` (RT-3): the loop hands each delivery to one of `n` worker
//! tasks, each with a mailbox of one. The loop first waits for an idle worker
//! and only then takes a delivery from the broker, so at most `n` deliveries
//! are in flight and none waits in the framework.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::sequential::next;
use super::stop::Stop;
use crate::binding::Broker;
use crate::pipeline::Unit;
use crate::subscriber::SendSubscriber;

pub(crate) async fn run<B: Broker, S: SendSubscriber>(
    unit: Arc<Unit<B, S>>,
    mut subscription: B::Subscription,
    stop: Stop,
    n: usize,
) {
    // Idle workers announce themselves here, one message per idle period.
    let (idle_tx, mut idle_rx) = mpsc::channel::<usize>(n);
    let mut mailboxes = Vec::with_capacity(n);
    let mut workers = Vec::with_capacity(n);
    for id in 0..n {
        let (mailbox, mut inbox) = mpsc::channel(1);
        mailboxes.push(mailbox);
        let unit = Arc::clone(&unit);
        let idle_tx = idle_tx.clone();
        workers.push(tokio::spawn(async move {
            while idle_tx.send(id).await.is_ok() {
                let Some(delivery) = inbox.recv().await else {
                    break;
                };
                unit.process(delivery).await;
            }
        }));
    }
    drop(idle_tx);

    loop {
        let id = tokio::select! {
            biased;
            id = idle_rx.recv() => match id {
                Some(id) => id,
                None => break,
            },
            () = stop.wait() => break,
        };
        let Some(delivery) = next(&mut subscription, &stop).await else {
            break;
        };
        if mailboxes[id].send(delivery).await.is_err() {
            // Unreachable while the worker lives: it announced itself idle and
            // waits on its mailbox. Dropping the delivery redelivers it.
            tracing::error!(subject = %unit.config.subject, "worker mailbox closed");
            break;
        }
    }
    // Workers finish the delivery in hand, see their mailbox closed and stop.
    drop(mailboxes);
    drop(idle_rx);
    for worker in workers {
        if let Err(err) = worker.await {
            tracing::error!(subject = %unit.config.subject, error = %err, "worker ended abnormally");
        }
    }
}
