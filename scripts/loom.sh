#!/usr/bin/env bash
# The loom models (ruststream/src/loom_models): every interleaving, up to a
# preemption bound, of the job queue's permits, a threads(n) ring, the
# subscription the workers share and the owner FIFOs, on the real code built with loom's
# locks and atomics. A separate target directory keeps the --cfg loom build
# from evicting the normal one. Debug assertions stay on in the optimized
# build: some invariants are debug_assert!s in the code.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTFLAGS="--cfg loom -C debug-assertions" CARGO_TARGET_DIR=target/loom \
  cargo test -p ruststream --lib --release loom_models -- --test-threads 2 "$@"
