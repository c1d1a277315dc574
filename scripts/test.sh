#!/usr/bin/env bash
# The whole test suite: formatting, lints, every test (unit, integration,
# doc tests including the book's and the README's examples, trybuild UI cases),
# a check that every file the book includes exists, the loom models, and
# every example run.
# Integration tests talk to real brokers on loopback: scripts/services.sh
# starts (and if needed installs) the ones that are down. The Kafka tests
# run on librdkafka's mock cluster, a Kafka-protocol server inside the test
# process.
set -euo pipefail
cd "$(dirname "$0")/.."

# Incremental artifacts only help edit-compile loops; here they only fill the disk.
export CARGO_INCREMENTAL=0

step() { printf '\n== %s\n' "$*"; }

step "build tools for librdkafka (scripts/services.sh)"
. scripts/services.sh
ensure_kafka_build

step "cargo fmt --all --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "cargo clippy -p ruststream: no features, and each binding alone, without warnings"
# Code only some bindings use must not warn in a build without them.
for features in "" nats redis rabbitmq kafka mqtt; do
  echo "-- features: ${features:-none}"
  cargo clippy -p ruststream --quiet --no-default-features ${features:+--features "$features"} -- -D warnings
done

step "layers: no import circle, no upward edge, no file over 600 lines (ARCHITECTURE.md)"
python3 scripts/modgraph.py ruststream/src --top --never binding/:exec/ --never binding/:app/ \
  --never binding/:pipeline --never binding/:host/ --never ingress/:app/ --never ingress/:host/ \
  --never host/:exec/ --never host/:app/ --never host/:pipeline --max-scc 1 --max-lines 600

step "cargo doc (links resolve, no warnings)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

step "book: every {{#include}} points at a file"
missing=0
while IFS=: read -r page include; do
  target=$(dirname "$page")/$include
  target=${target%%:*}
  if [ ! -f "$target" ]; then
    echo "missing include in $page: $include"
    missing=1
  fi
done < <(grep -o '{{#include [^}]*}}' -r book/src | sed 's/{{#include \([^}]*\)}}/\1/')
[ "$missing" = 0 ]

step "broker services on loopback (NATS, Redis, RabbitMQ, Mosquitto; Kafka runs in-process)"
ensure_nats
ensure_redis
ensure_rabbitmq
ensure_mosquitto

step "the official AsyncAPI parser for the document tests (npm ci in scripts/asyncapi)"
command -v npm >/dev/null || apt_install nodejs npm
(cd scripts/asyncapi && npm ci --no-audit --no-fund --loglevel=error)

step "cargo test --workspace --all-features"
cargo test --workspace --all-features

step "loom models of the concurrent hand-offs (scripts/loom.sh)"
scripts/loom.sh

step "every example runs and exits 0 on its own"
for example in quickstart execution_modes lifecycle middleware nats_orders redis_orders rabbitmq_orders kafka_orders mqtt_sensors; do
  echo "-- $example"
  timeout 120 cargo run --quiet --example "$example"
done
echo "-- quickstart asyncapi (JSON and YAML), validated by @asyncapi/parser"
asyncapi_out=$(mktemp -d)
timeout 120 cargo run --quiet --example quickstart -- asyncapi --output "$asyncapi_out/quickstart.json"
timeout 120 cargo run --quiet --example quickstart -- asyncapi --format yaml --output "$asyncapi_out/quickstart.yaml"
node scripts/asyncapi/validate.mjs "$asyncapi_out/quickstart.json" "$asyncapi_out/quickstart.yaml"
echo "-- observability, on a port the system picks"
RUSTSTREAM_METRICS_ADDR=127.0.0.1:0 timeout 120 cargo run --quiet --example observability
echo "-- new-project (the guide's new service), on the memory broker and on NATS"
timeout 120 cargo run --quiet -p orders-service
NATS_URL="${RUSTSTREAM_NATS_URL:-nats://127.0.0.1:4222}" timeout 120 cargo run --quiet -p orders-service

step "book: every test the Guarantees chapter names exists"
missing=0
while read -r file name; do
  if ! grep -qw "fn $name" "ruststream/tests/$file"; then
    echo "book/src/guarantees.md names $file::$name, which does not exist"
    missing=1
  fi
done < <(grep -o '[a-z_]*\.rs::[a-z0-9_]*' book/src/guarantees.md | sed 's/::/ /')
[ "$missing" = 0 ]
