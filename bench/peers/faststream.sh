#!/usr/bin/env bash
# ruststream next to FastStream, the framework a Python team would pick
# instead, on one workload: N (default 100,000) messages of 512 bytes,
# consumed by one subscriber whose handler takes the body as bytes and
# counts it. Every consumer is its own process, on the same broker and the
# same machine; ROUNDS (default 3) interleaved rounds (per broker: ours,
# then FastStream), then the medians and the ratios. Not part of CI.
#
# What each side does, per broker (BROKERS picks them; default all three):
#
# * nats-core: a plain core NATS subscription on `bench.peers` (no queue
#   group, nothing to acknowledge). Once the consumer is subscribed, a
#   separate process (`ruststream-bench peer-publish-nats`, raw async-nats)
#   publishes the N messages, without headers, as fast as the server takes
#   them but never more than 10,000 beyond what the consumer has reported
#   handled (both consumers print `handled=<k>` every 1,000 messages; the
#   driver passes the lines on). Core NATS has no flow control of its own:
#   without that credit nats-server 2.9 cut FastStream's subscriber off
#   mid-run on a loaded machine. A consumer that keeps up never waits.
# * redis-streams: the stream `bench.peers` holds the N entries before the
#   consumer starts, group `bench` at its beginning; one consumer of the
#   group reads 100 entries per XREADGROUP and acknowledges every entry.
#   Each entry is what the side's own publisher writes: ours a field `p`
#   holding the 512 bytes; FastStream a field `__data__` holding its binary
#   envelope (the 512 bytes and a correlation-id header), encoded by
#   FastStream's own code. Acks: FastStream sends one XACK per message after
#   the handler; ours acknowledges every entry too, coalescing the XACKs.
# * rabbitmq: the durable queue `bench@bench.peers` holds the N messages
#   (raw, no properties; loaded by `ruststream-bench peer-load-rabbitmq` with
#   publisher confirms) before the consumer starts; a prefetch of 256 and
#   every delivery acknowledged after its handler. Acks: FastStream one
#   basic.ack per delivery; ours coalesces them into basic.ack(multiple).
#
# Ours: `ruststream-bench peer-<broker>` (bench/src/peers.rs), an app with
# one #[subscriber] on the default sequential loop, Tokio's multi-thread
# runtime with 2 workers. FastStream (bench/peers/faststream_consumer.py,
# versions pinned in requirements.txt): one @broker.subscriber with its
# defaults (one message at a time, asyncio's event loop, argument
# validation, its acknowledgement policy) except per-message logging,
# which is off (`logger=None`) because ours logs nothing per message.
#
# Measured inside each consumer process, the same way on both sides:
# msgs/s and CPU seconds (user + system, all threads, getrusage) from the
# first message handled to the N-th, and the peak resident set (VmHWM)
# when the N-th was handled. Loading and publishing are other processes and
# are not measured. Ratios: ours/theirs for msgs/s, theirs/ours for CPU
# and memory, so above 1x means ruststream is ahead.
#
# Needs nats-server on RUSTSTREAM_NATS_URL (default 127.0.0.1:4222), Redis
# on RUSTSTREAM_REDIS_URL (127.0.0.1:6379) and RabbitMQ on
# RUSTSTREAM_AMQP_URL (guest:guest@127.0.0.1:5672); Python 3.10 or newer
# (PYTHON, default python3) with pip. FastStream goes into
# bench/peers/.venv (ignored by git), made or remade when requirements.txt
# changes. One round takes about 1.5 minutes, most of it FastStream on
# Redis.
#
#   bench/peers/faststream.sh                  # all three, 3 rounds
#   ROUNDS=5 BROKERS=nats-core bench/peers/faststream.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)

venv=$here/.venv
if ! cmp -s "$here/requirements.txt" "$venv/requirements.txt" 2>/dev/null; then
  echo "installing FastStream into $venv" >&2
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$here/requirements.txt"
  cp "$here/requirements.txt" "$venv/requirements.txt"
fi

cargo build --release -p ruststream-bench --features peers --manifest-path "$root/Cargo.toml" >&2
# A copy of our own: a shared target dir may get the bench rebuilt with
# other features while the rounds run.
mkdir -p "$here/.bin"
cp "${CARGO_TARGET_DIR:-$root/target}/release/ruststream-bench" "$here/.bin/"
exec "$venv/bin/python" "$here/compare.py" "$here/.bin/ruststream-bench"
