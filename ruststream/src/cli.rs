//! The command line of a `#[ruststream::app]` binary (feature `cli`):
//!
//! ```text
//! service [--config FILE] [run]                      run until SIGINT/SIGTERM (the default)
//! service [--config FILE] asyncapi [--format json|yaml] [--output FILE]
//! service [--config FILE] check                      settings valid and brokers reached: exit 0, else 1
//! service --help
//! ```
//!
//! The binary parses it when its `main` returns the `App` (`Result<App<B>,
//! E>`); a `main` that returns `()` keeps its arguments to itself. To add
//! arguments of your own, flatten [`AppArgs`] into your `clap` parser and
//! hand it the app:
//!
//! ```no_run
//! use clap::Parser;
//! use ruststream::cli::AppArgs;
//! use ruststream::prelude::*;
//!
//! #[derive(Parser)]
//! struct Cli {
//!     /// The region this instance serves.
//!     #[arg(long, default_value = "eu")]
//!     region: String,
//!     #[command(flatten)]
//!     app: AppArgs,
//! }
//!
//! #[tokio::main]
//! async fn main() -> std::process::ExitCode {
//!     let cli = Cli::parse();
//!     let settings = match cli.app.settings() {
//!         Ok(settings) => settings,
//!         Err(err) => {
//!             eprintln!("{err}");
//!             return std::process::ExitCode::FAILURE;
//!         }
//!     };
//!     let app = App::new().name(format!("orders-{}", cli.region)).broker(MemoryBroker::new());
//!     cli.app.run(app, settings).await
//! }
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use crate::launch::{Launch, Task, finish_app};
use crate::settings::Settings;
use crate::{App, Broker, Result};

/// The arguments every app understands: `--config FILE` and a command.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AppArgs {
    /// Settings file (TOML); `RUSTSTREAM__…` environment variables override it.
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// What to do (default: run).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What the app is asked to do.
#[derive(clap::Subcommand, Clone, Debug)]
pub enum Command {
    /// Run the service until SIGINT or SIGTERM (the default).
    Run,
    /// Write the service's AsyncAPI 3.0 document.
    Asyncapi {
        /// The document's format.
        #[arg(long, value_enum, default_value_t = Format::Json)]
        format: Format,
        /// Write it to FILE instead of standard output.
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Load and validate the settings and connect to every broker: exit 0,
    /// or 1 with the reason.
    Check,
}

/// An AsyncAPI document's format.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

/// The command line of a `#[ruststream::app]` binary.
#[derive(clap::Parser, Debug)]
#[command(about = "A ruststream service.")]
struct Cli {
    #[command(flatten)]
    app: AppArgs,
}

impl AppArgs {
    /// The process's arguments, as a `#[ruststream::app]` binary reads
    /// them (`--help` and mistakes print and exit).
    pub fn from_env() -> Self {
        <Cli as clap::Parser>::parse().app
    }

    /// The settings: `--config FILE` if given, then the environment.
    pub fn settings(&self) -> Result<Settings> {
        Settings::load(self.config.as_deref())
    }

    /// Applies `settings` to `app` and does the command: runs it, checks
    /// it, or writes its AsyncAPI document. The exit code says how it went.
    pub async fn run<B: Broker>(&self, app: App<B>, settings: Settings) -> ExitCode {
        let mut launch = Launch::run(crate::launch::RuntimeConfig::default());
        launch.task = self.task();
        launch.settings = Some(settings);
        finish_app(app, launch).await
    }

    pub(crate) fn task(&self) -> Task {
        match &self.command {
            None | Some(Command::Run) => Task::Run,
            Some(Command::Check) => Task::Check,
            Some(Command::Asyncapi { format, output }) => Task::AsyncApi {
                yaml: *format == Format::Yaml,
                output: output.clone(),
            },
        }
    }
}
