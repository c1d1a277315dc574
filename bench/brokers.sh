#!/usr/bin/env bash
# Framework vs the raw client of each broker in the same binary, 100k x 512 B
# messages, each counted through the same shared counter on both sides:
# NATS core pub/sub, JetStream consumption with one ack per message, Redis
# Streams read 100 at a time (a handler per message, and a batch handler of
# up to 100). Prints the median msgs/s of 5
# interleaved rounds, the framework/raw ratio of those medians, the
# median of the rounds' own ratios (`paired`), and the median CPU time per
# message of each side's process (all threads, user + system, over the
# timed span) with the framework/raw ratio of those: with the server on the
# same cores, throughput follows CPU time. Needs NATS with JetStream
# (RUSTSTREAM_NATS_URL, default 127.0.0.1:4222) and Redis
# (RUSTSTREAM_REDIS_URL, default 127.0.0.1:6379). Kafka: a consumer group
# reading preloaded records, framework vs a raw rdkafka StreamConsumer
# committing each record (async), on librdkafka's mock cluster in the bench
# process (or RUSTSTREAM_KAFKA_BOOTSTRAP). MQTT: QoS 1 consumption with a
# PUBACK per message (receive maximum 64) from a raw rumqttc publisher,
# framework vs a raw rumqttc event loop (TCP_NODELAY everywhere, as the
# binding sets it) in a task of the runtime, as the framework's loop, and
# again on the main thread (raw-mqtt-main: see bench/src/mqtt.rs), on Mosquitto
# (RUSTSTREAM_MQTT_URL, default mqtt://127.0.0.1:1883).
# BROKERS picks the brokers (default: all), e.g. `BROKERS=kafka
# bench/brokers.sh` runs only the Kafka pair and needs no server.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
brokers=${BROKERS:-nats redis rabbitmq kafka mqtt}
features=$(echo $brokers | tr ' ' ',')
cargo build --release -p ruststream-bench --features "$features" --manifest-path "$root/Cargo.toml" >&2
bin=${CARGO_TARGET_DIR:-$root/target}/release/ruststream-bench
n=${N:-100000}
rounds=5

field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p"; }
median() { tr -s ' \n' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

declare -A rates cpus
mapfile -t scenarios < <("$bin" --list-brokers)
for ((round = 1; round <= rounds; round++)); do
  for s in "${scenarios[@]}"; do
    line=$("$bin" "$s" "$n")
    rates[$s]+="$(field msgs_per_s <<<"$line") "
    cpus[$s]+="$(field cpu_s <<<"$line") "
  done
done
# Median CPU microseconds per message of scenario $1.
cpu_us() { awk -v c="$(echo "${cpus[$1]}" | median)" -v n="$n" 'BEGIN { printf "%.2f", c * 1e6 / n }'; }
# paired: the median of each round's own ratio (the two ran back to back),
# steadier than the ratio of medians when the machine's speed drifts.
paired() { paste -d' ' <(tr -s ' ' '\n' <<<"$1" | grep .) <(tr -s ' ' '\n' <<<"$2" | grep .) | awk '{ print $1 / $2 }' | median; }
printf '%-16s %12s %8s %8s %10s %8s\n' scenario msgs/s vs-raw paired cpu-us/msg cpu-vs-raw
for pair in "nats-core raw-nats-core" "nats-json raw-nats-json" "nats-js raw-nats-js" "redis-streams raw-redis-streams" "redis-streams-batch raw-redis-streams" "rabbitmq raw-rabbitmq" "kafka raw-kafka" "mqtt raw-mqtt" "mqtt raw-mqtt-main"; do
  read -r fw raw <<<"$pair"
  [[ -n "${rates[$fw]:-}" ]] || continue
  f=$(echo "${rates[$fw]}" | median)
  r=$(echo "${rates[$raw]}" | median)
  fc=$(cpu_us "$fw")
  rc=$(cpu_us "$raw")
  printf '%-16s %12.0f %8s %8s %10s %8s\n' "$raw" "$r" "1.00" "" "$rc" "1.00"
  printf '%-16s %12.0f %8.3f %8.3f %10s %8.3f\n' "$fw" "$f" "$(awk -v f="$f" -v r="$r" 'BEGIN { print f / r }')" \
    "$(paired "${rates[$fw]}" "${rates[$raw]}")" "$fc" "$(awk -v f="$fc" -v r="$rc" 'BEGIN { print (r > 0 ? f / r : "nan") }')"
done
