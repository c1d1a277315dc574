//! Procedural macros of [ruststream](https://docs.rs/ruststream). Use them
//! through that crate (`ruststream::app`, `ruststream::subscriber`): the
//! generated code refers to `::ruststream` and delegates everything to it.

mod app;
mod args;
mod batch;
mod mode;
mod subscriber;

use proc_macro::TokenStream;

/// Turns `async fn main` into a program that runs on a Tokio runtime.
///
/// Arguments: `flavor = "multi_thread"` (default) or `"current_thread"`,
/// `worker_threads = n` (multi-thread only), and `shutdown_timeout = "30s"`
/// (bounds the graceful shutdown of every `App` the binary builds). `main` may return `()`,
/// `Result<(), E>`, or `Result<App<B>, E>`: an app is run until SIGINT/SIGTERM
/// and then shut down gracefully. It takes no argument, or one:
/// `settings: ruststream::settings::Settings` (feature `config`), the
/// settings the binary loaded. With ruststream's `cli` feature a binary
/// whose `main` returns the app understands `run`, `check`, `asyncapi` and
/// `--config FILE`.
#[proc_macro_attribute]
pub fn app(args: TokenStream, item: TokenStream) -> TokenStream {
    app::expand(args.into(), item.into()).into()
}

/// Marks an `async fn` as a message handler.
///
/// `#[subscriber("subject", queue_group = "g", dead_letter = "s.dlq",
/// max_attempts = 3, codec = path::To::Codec, fail_fast, receive_flow = bool,
/// max_message_size = bytes)]`,
/// plus an execution mode: `workers(n)`, `workers(n, by_key)`,
/// `workers(n, by_key = key_fn)` (with `max_pending = n`,
/// `max_pending_per_key = n` and `max_pending_bytes_per_key = bytes`), `threads(n)`, `threads(n, by_key)`. Each argument
/// maps to the `SubscriberConfig` method of the same name. The function keeps its name
/// and stays directly callable and awaitable; a companion type of the same
/// name carries the configuration for `App::subscriber`.
#[proc_macro_attribute]
pub fn subscriber(args: TokenStream, item: TokenStream) -> TokenStream {
    subscriber::expand(args.into(), item.into()).into()
}
