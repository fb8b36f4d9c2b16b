#!/usr/bin/env bash
# The whole test suite. MLX's CPU backend uses both cores per test process, so tests run two at a
# time (MLX_GEN_TEST_THREADS to change it).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace --no-fail-fast -- --test-threads="${MLX_GEN_TEST_THREADS:-2}"
