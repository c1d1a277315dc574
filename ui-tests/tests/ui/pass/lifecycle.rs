use std::time::Duration;

use ruststream::prelude::*;

struct Db {
    url: &'static str,
}

#[subscriber("jobs", fail_fast, max_attempts = 2)]
async fn job(body: String, db: State<Db>, ctx: Ctx) {
    let _ = (body, db.url);
    ctx.and_after(async {});
    ctx.retry_after(Duration::from_secs(1));
}

#[ruststream::app(shutdown_timeout = "1500ms")]
async fn main() -> ruststream::Result<()> {
    let _app = App::new()
        .broker(MemoryBroker::new())
        .state(Db { url: "postgres://localhost" })
        .on_startup(|_app| async { Ok(()) })
        .on_shutdown(|_app| async { Ok(()) })
        .subscriber(job);
    Ok(())
}
