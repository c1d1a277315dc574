//! `ruststream-bench <scenario> <N>`: runs one scenario over N messages and
//! prints one line:
//!
//! ```text
//! scenario=<name> msgs=<N> secs=<t> msgs_per_s=<r> cpu_s=<c>[ allocs_per_msg=<x>]
//! ```
//!
//! `cpu_s` is the process's CPU time (user + system, all threads) over the
//! same span as `secs`.
//!
//! `ruststream-bench --list` prints the scenario names, one per line (the
//! scripts read them from here); `--list-brokers` the ones that need a
//! broker server (NATS on `RUSTSTREAM_NATS_URL`, Redis on
//! `RUSTSTREAM_REDIS_URL`), built with the bench's `nats` and `redis`
//! features and run by `bench/brokers.sh`. The `peer-*` scenarios (feature
//! `peers`) are run by `bench/peers/faststream.sh` and also print
//! `peak_rss_kib=<VmHWM>`.
//!
//! Environment:
//! * `RUSTSTREAM_BENCH_RT`: `multi` (default; multi-thread runtime, 2 worker
//!   threads) or `current` (current-thread runtime, for deterministic
//!   instruction counts under callgrind).
//! * `RUSTSTREAM_BENCH_ALLOCS=1`: count allocations in the timed section and
//!   append `allocs_per_msg`.

mod alloc;
/// A broker's scenario module, or an empty one when the bench is built
/// without its feature.
macro_rules! broker_scenarios {
    ($feature:literal, $module:ident) => {
        #[cfg(feature = $feature)]
        mod $module;
        #[cfg(not(feature = $feature))]
        mod $module {
            pub const NAMES: &[&str] = &[];
            pub async fn run(
                _name: &str,
                _n: u64,
            ) -> Option<Result<crate::scenarios::Measurement, ruststream::BoxError>> {
                None
            }
        }
    };
}
broker_scenarios!("nats", nats);
broker_scenarios!("redis", redis);
broker_scenarios!("rabbitmq", rabbitmq);
broker_scenarios!("kafka", kafka);
broker_scenarios!("mqtt", mqtt);
broker_scenarios!("peers", peers);
mod payload;
mod progress;
mod scenarios;

use std::process::ExitCode;
use std::sync::Arc;

#[global_allocator]
static GLOBAL: alloc::Counting = alloc::Counting;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args == ["--list"] || args == ["--list-brokers"] {
        let names: Vec<&str> = if args[0] == "--list" {
            scenarios::NAMES.to_vec()
        } else {
            [
                nats::NAMES,
                redis::NAMES,
                rabbitmq::NAMES,
                kafka::NAMES,
                mqtt::NAMES,
            ]
            .concat()
        };
        for name in names {
            println!("{name}");
        }
        return ExitCode::SUCCESS;
    }
    let known = |s: &str| {
        scenarios::NAMES.contains(&s)
            || nats::NAMES.contains(&s)
            || redis::NAMES.contains(&s)
            || rabbitmq::NAMES.contains(&s)
            || kafka::NAMES.contains(&s)
            || mqtt::NAMES.contains(&s)
            || peers::NAMES.contains(&s)
    };
    let (scenario, n) = match args.as_slice() {
        [scenario, n] if known(scenario) => match n.parse::<u64>() {
            Ok(n) if n > 0 => (scenario.as_str(), n),
            _ => return usage(),
        },
        _ => return usage(),
    };
    let runtime = match std::env::var("RUSTSTREAM_BENCH_RT").as_deref() {
        Ok("multi") | Err(_) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build(),
        Ok("current") => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        Ok(other) => {
            eprintln!("RUSTSTREAM_BENCH_RT must be `multi` or `current`, not `{other}`");
            return ExitCode::from(2);
        }
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("cannot start the Tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let count_allocs = std::env::var("RUSTSTREAM_BENCH_ALLOCS").is_ok_and(|v| v == "1");
    if count_allocs {
        alloc::enable();
    }

    // Only the memory scenarios publish pre-built payloads.
    let payloads = payload::build(if scenarios::NAMES.contains(&scenario) {
        n
    } else {
        0
    });
    let measured = runtime.block_on(async {
        if let Some(measured) = nats::run(scenario, n).await {
            return Some(measured);
        }
        if let Some(measured) = redis::run(scenario, n).await {
            return Some(measured);
        }
        if let Some(measured) = rabbitmq::run(scenario, n).await {
            return Some(measured);
        }
        if let Some(measured) = kafka::run(scenario, n).await {
            return Some(measured);
        }
        if let Some(measured) = mqtt::run(scenario, n).await {
            return Some(measured);
        }
        if let Some(measured) = peers::run(scenario, n).await {
            return Some(measured);
        }
        scenarios::run(scenario, Arc::clone(&payloads)).await
    });
    payload::discard(payloads);
    let m = match measured {
        Some(Ok(m)) => m,
        Some(Err(err)) => {
            eprintln!("scenario {scenario} failed: {err}");
            return ExitCode::FAILURE;
        }
        None => return usage(),
    };

    let secs = m.elapsed.as_secs_f64();
    let mut line = format!(
        "scenario={scenario} msgs={n} secs={secs:.6} msgs_per_s={:.0} cpu_s={:.3}",
        n as f64 / secs,
        m.cpu.as_secs_f64()
    );
    if let Some(kib) = m.peak_rss_kib {
        line += &format!(" peak_rss_kib={kib}");
    }
    if count_allocs {
        line += &format!(" allocs_per_msg={:.2}", m.allocs as f64 / n as f64);
    }
    println!("{line}");
    ExitCode::SUCCESS
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: ruststream-bench <scenario> <N>   (N >= 1; scenarios: {})",
        scenarios::NAMES.join(", ")
    );
    ExitCode::from(2)
}
