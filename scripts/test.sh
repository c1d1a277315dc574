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

step() { printf '\n== %s\n' "$*"; }

step "build tools for librdkafka (scripts/services.sh)"
. scripts/services.sh
ensure_kafka_build

step "cargo fmt --all --check"
cargo fmt --all --check

step "cargo clippy --workspace --all-targets --all-features -- -D warnings"
cargo clippy --workspace --all-targets --all-features -- -D warnings

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

step "broker services on loopback (NATS, Redis, RabbitMQ; Kafka runs in-process)"
ensure_nats
ensure_redis
ensure_rabbitmq

step "cargo test --workspace --all-features"
cargo test --workspace --all-features

step "loom models of the concurrent hand-offs (scripts/loom.sh)"
scripts/loom.sh

step "every example runs and exits 0 on its own"
for example in quickstart execution_modes lifecycle nats_orders redis_orders rabbitmq_orders kafka_orders; do
  echo "-- $example"
  timeout 120 cargo run --quiet --example "$example"
done
