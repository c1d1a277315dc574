//! `main` may return `ruststream::Result<App<B>>`: the app then runs until
//! SIGINT/SIGTERM. trybuild runs pass cases, so the annotated function here is
//! only compiled, never called.
use ruststream::prelude::*;

#[subscriber("greetings")]
async fn greet(name: String) -> String {
    format!("hello, {name}")
}

mod server {
    use super::*;

    #[allow(dead_code)]
    #[ruststream::app]
    pub async fn main() -> ruststream::Result<App<MemoryBroker>> {
        Ok(App::new().broker(MemoryBroker::new()).subscriber(greet))
    }

    #[allow(dead_code)]
    #[ruststream::app(flavor = "current_thread")]
    pub async fn plain() -> App<MemoryBroker> {
        App::new().broker(MemoryBroker::new()).subscriber(greet)
    }
}

fn main() {
    // `server::main` has the signature of a program's `main`.
    let _entry: fn() -> std::process::ExitCode = server::main;
    let _entry: fn() -> std::process::ExitCode = server::plain;
}
