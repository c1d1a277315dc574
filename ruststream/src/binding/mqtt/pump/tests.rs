//! The pump's hand-offs between the reader and the connection task.

use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::sync::Notify;

use super::*;

/// A drive that counts its polls and waits for `go` `rounds` times.
fn counting(go: Arc<Notify>, rounds: usize) -> (Arc<Pump>, Arc<AtomicUsize>) {
    let polls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&polls);
    let pump = Pump::new(|_| async move {
        for _ in 0..rounds {
            seen.fetch_add(1, SeqCst);
            go.notified().await;
        }
    });
    (pump, polls)
}

/// The connection task ends within a bound.
async fn ends(task: tokio::task::JoinHandle<()>, what: &str) {
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 5 s"))
        .expect("no panic");
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while !check() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

#[tokio::test]
async fn the_task_polls_while_nobody_reads_and_ends_with_the_drive() {
    let go = Arc::new(Notify::new());
    let (pump, polls) = counting(Arc::clone(&go), 3);
    let task = tokio::spawn(Arc::clone(&pump).task());
    eventually("the first poll", || polls.load(SeqCst) == 1).await;
    go.notify_one();
    eventually("the second poll", || polls.load(SeqCst) == 2).await;
    go.notify_one();
    eventually("the third poll", || polls.load(SeqCst) == 3).await;
    go.notify_one();
    ends(task, "the task ends with the drive").await;
    assert!(pump.is_done());
}

#[tokio::test]
async fn a_reader_gets_the_wake_ups_and_hands_them_back_when_it_leaves() {
    let go = Arc::new(Notify::new());
    let (pump, polls) = counting(Arc::clone(&go), 4);
    // No task yet: only the reader polls.
    let reader = pump.reader();
    poll_once(&reader).await;
    assert_eq!(polls.load(SeqCst), 1, "the reader polled the drive");
    // Woken while the reader waits: the reader's task is woken, and
    // its next poll drives.
    let woke = poll_fn(|cx| {
        reader.poll(cx);
        if polls.load(SeqCst) == 2 {
            Poll::Ready(())
        } else {
            if polls.load(SeqCst) == 1 {
                go.notify_one();
            }
            Poll::Pending
        }
    });
    tokio::time::timeout(Duration::from_secs(5), woke)
        .await
        .expect("the reader's task is woken for the drive");
    // The reader leaves with nothing pending; the next wake-up goes to
    // the connection task.
    drop(reader);
    let task = tokio::spawn(Arc::clone(&pump).task());
    go.notify_one();
    eventually("the task's poll", || polls.load(SeqCst) == 3).await;
    go.notify_one();
    eventually("the last poll", || polls.load(SeqCst) == 4).await;
    go.notify_one();
    ends(task, "the task ends with the drive").await;
}

#[tokio::test]
async fn a_wake_up_left_by_the_reader_goes_to_the_task() {
    let go = Arc::new(Notify::new());
    let (pump, polls) = counting(Arc::clone(&go), 2);
    let task = tokio::spawn(Arc::clone(&pump).task());
    eventually("the first poll", || polls.load(SeqCst) == 1).await;
    {
        let reader = pump.reader();
        poll_once(&reader).await;
        // Woken while the reader has the turn, but it leaves before
        // polling again.
        go.notify_one();
    }
    eventually("the task's poll", || polls.load(SeqCst) == 2).await;
    go.notify_one();
    ends(task, "the task ends with the drive").await;
}

#[tokio::test]
async fn the_readers_own_wake_ups_wait_for_its_next_read() {
    let go = Arc::new(Notify::new());
    let (pump, polls) = counting(Arc::clone(&go), 3);
    let task = tokio::spawn(Arc::clone(&pump).task());
    eventually("the first poll", || polls.load(SeqCst) == 1).await;
    let reader = tokio::spawn({
        let (pump, polls, go) = (Arc::clone(&pump), Arc::clone(&polls), Arc::clone(&go));
        async move {
            pump.poke();
            // Woken from the reader's task (as by its ack): nobody
            // else polls, though the connection task had every chance.
            go.notify_one();
            for _ in 0..8 {
                tokio::task::yield_now().await;
            }
            assert_eq!(polls.load(SeqCst), 1, "left for the reader's next read");
            pump.poke();
            assert_eq!(polls.load(SeqCst), 2, "the reader's next read polls");
        }
    });
    tokio::time::timeout(Duration::from_secs(5), reader)
        .await
        .expect("the reader finishes")
        .expect("no panic");
    // Woken from elsewhere: the connection task polls.
    go.notify_one();
    eventually("the task's poll", || polls.load(SeqCst) == 3).await;
    go.notify_one();
    ends(task, "the task ends with the drive").await;
}

/// A drive that yields to the reader after each step, then waits for
/// `go`: counts the steps begun and the ones past the yield.
fn yielding(go: Arc<Notify>) -> (Arc<Pump>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (begun, past) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (b, p) = (Arc::clone(&begun), Arc::clone(&past));
    let pump = Pump::new(move |turn| async move {
        loop {
            b.fetch_add(1, SeqCst);
            turn.yield_to_reader().await;
            p.fetch_add(1, SeqCst);
            go.notified().await;
        }
    });
    (pump, begun, past)
}

/// The reader polls first; the drive stops at its yield.
async fn read_once(pump: &Pump) {
    poll_once(&pump.reader()).await;
}

/// One read by `reader`, whatever it finds.
async fn poll_once(reader: &Reader<'_>) {
    poll_fn(|cx| {
        reader.poll(cx);
        Poll::Ready(())
    })
    .await;
}

#[tokio::test]
async fn a_drive_that_yields_to_the_reader_waits_for_its_next_read() {
    let go = Arc::new(Notify::new());
    let (pump, begun, past) = yielding(Arc::clone(&go));
    read_once(&pump).await;
    assert_eq!((begun.load(SeqCst), past.load(SeqCst)), (1, 0));
    let task = tokio::spawn(Arc::clone(&pump).task());
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    assert_eq!(past.load(SeqCst), 0, "nobody polls it but the reader");
    pump.poke();
    assert_eq!(past.load(SeqCst), 1, "the reader's next read goes on");
    // Woken from elsewhere, the connection task polls, and does not
    // stop at the yield.
    go.notify_one();
    eventually("the task's poll past the yield", || past.load(SeqCst) == 2).await;
    assert_eq!(begun.load(SeqCst), 2);
    pump.stop();
    ends(task, "the task ends once stopped").await;
}

#[tokio::test]
async fn a_released_drive_goes_on_in_the_connection_task() {
    let go = Arc::new(Notify::new());
    let (pump, _, past) = yielding(go);
    read_once(&pump).await;
    let task = tokio::spawn(Arc::clone(&pump).task());
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
    assert_eq!(past.load(SeqCst), 0, "it waits for the reader");
    // The reader will not read for a while (paused flow, close).
    pump.release();
    eventually("the task's poll past the yield", || past.load(SeqCst) == 1).await;
    pump.stop();
    ends(task, "the task ends once stopped").await;
}

/// The reader reads while the connection task holds the drive without
/// a wake-up to poll it for: the read that a yielded drive waits for is
/// left to the task, not lost. (Lost, a subscription with its receive
/// maximum of publishes in hand stalled until the keep-alive.)
#[tokio::test]
async fn a_read_while_the_task_holds_the_drive_is_not_lost() {
    let go = Arc::new(Notify::new());
    let (pump, _, past) = yielding(go);
    read_once(&pump).await;
    let task = tokio::spawn(Arc::clone(&pump).task());
    {
        // The task's `run`, with nothing to poll for, around the read.
        let held = pump.drive.lock().unwrap();
        pump.route.polling.store(TASK, SeqCst);
        pump.poke();
        pump.route.polling.store(NOBODY, SeqCst);
        drop(held);
        pump.route.after_poll();
    }
    eventually("the task's poll past the yield", || past.load(SeqCst) == 1).await;
    pump.stop();
    ends(task, "the task ends once stopped").await;
}

/// A reader on a dedicated thread polls the drive with its runtime's
/// cooperative budget spent, then parks without running that runtime:
/// the drive, stopped by the budget, goes on in the connection task.
/// (Left to the thread's runtime, that wake-up waited for the next
/// keep-alive, with the acks queued meanwhile.)
#[tokio::test]
async fn a_drive_stopped_by_the_readers_budget_goes_on_in_the_connection_task() {
    let past = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&past);
    let pump = Pump::new(move |turn| async move {
        turn.yield_to_reader().await;
        tokio::task::coop::consume_budget().await;
        seen.fetch_add(1, SeqCst);
        std::future::pending::<()>().await;
    });
    read_once(&pump).await;
    let task = tokio::spawn(Arc::clone(&pump).task());
    let reader = Arc::clone(&pump);
    let went_on = tokio::task::spawn_blocking(move || {
        let thread = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        thread.block_on(async {
            spend_budget().await;
            reader.poke();
            // Parked, as an idle dedicated thread: its runtime runs no
            // deferred wake-up meanwhile.
            let until = std::time::Instant::now() + Duration::from_secs(5);
            while past.load(SeqCst) == 0 && std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
            past.load(SeqCst)
        })
    })
    .await
    .expect("no panic");
    assert_eq!(went_on, 1, "the connection task polled the drive on");
    pump.stop();
    ends(task, "the task ends once stopped").await;
}

/// Spends the current task's cooperative budget.
async fn spend_budget() {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    for _ in 0..1_000 {
        tx.send(()).unwrap();
    }
    poll_fn(|cx| {
        while rx.poll_recv(cx).is_ready() {}
        Poll::Ready(())
    })
    .await;
    assert!(!tokio::task::coop::has_budget_remaining());
}

#[tokio::test]
async fn stop_drops_a_drive_that_never_ends() {
    struct Dropped(Arc<AtomicBool>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.store(true, SeqCst);
        }
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let guard = Dropped(Arc::clone(&dropped));
    let pump = Pump::new(|_| async move {
        let _guard = guard;
        std::future::pending::<()>().await;
    });
    let task = tokio::spawn(Arc::clone(&pump).task());
    pump.stop();
    assert!(dropped.load(SeqCst), "the drive was dropped");
    ends(task, "the task ends once stopped").await;
}
