//! `#[ruststream::app]` settings that reach the apps `main` builds itself.
//! A test binary of its own: the macro's shutdown timeout is the default of
//! every `App` of the process, which would reach other tests' apps.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ruststream::prelude::*;
use tokio::sync::Notify;

static STARTED: Notify = Notify::const_new();
static FINISHED: AtomicBool = AtomicBool::new(false);

#[subscriber("macro.stuck")]
async fn stuck(_job: Bytes) {
    STARTED.notify_one();
    tokio::time::sleep(Duration::from_secs(30)).await;
    FINISHED.store(true, Ordering::SeqCst);
}

/// `main` starts and stops its app itself (it does not return it): the
/// macro's `shutdown_timeout` still bounds that app's shutdown.
#[ruststream::app(flavor = "current_thread", shutdown_timeout = "300ms")]
async fn service() -> ruststream::Result<()> {
    let broker = MemoryBroker::new();
    let running = App::new()
        .broker(broker.clone())
        .subscriber(stuck)
        .start()
        .await?;
    broker
        .publish_message("macro.stuck", Message::new("job"), None)
        .await?;
    tokio::time::timeout(Duration::from_secs(5), STARTED.notified())
        .await
        .expect("the handler starts");
    let asked = Instant::now();
    running.shutdown().await?;
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "the shutdown took {:?}: the macro's 300ms timeout did not bound it",
        asked.elapsed()
    );
    Ok(())
}

#[test]
fn the_macros_shutdown_timeout_bounds_an_app_main_starts_itself() {
    assert_eq!(service(), std::process::ExitCode::SUCCESS);
    assert!(
        !FINISHED.load(Ordering::SeqCst),
        "the stuck handler was aborted"
    );
}
