#!/usr/bin/env bash
# Whole-process adapter throughput and peak memory, per wire family (docs/performance.md).
#
# Grows one of the project's own fixtures to a single run of SIZE MiB with `streamgate
# synth` (its delta records repeated in place), then times `streamgate normalize` over it
# RUNS times (wall time from bash's clock, peak RSS from /usr/bin/time) and prints the
# median MB/s, the largest peak RSS, and the slowest and fastest run's MB/s. Beside
# them, the same machine's baseline: `streamgate bench json` validating every JSON
# document of the same capture with serde_json, timed the same way (median MB/s), and the
# adapter's share of it (the performance goal: half).
#
#   scripts/bench-adapters.sh [SIZE_MIB=100] [RUNS=3] [FAMILY ...]
#
# Needs a release build (`cargo build --release`), or STREAMGATE_BIN naming another build
# to compare; writes its captures to $TMPDIR.
#
# INSTRUCTIONS=1 counts instructions instead (valgrind's callgrind, once per family):
# the same count for the same build and input however busy the machine is, for comparing
# builds where wall times are too noisy. Use a smaller SIZE (10): it runs ~50x slower.
set -euo pipefail
# bash writes $EPOCHREALTIME with the locale's decimal point; awk reads a dot.
export LC_ALL=C
cd "$(dirname "$0")/.."

size="${1:-100}"
runs="${2:-3}"
shift $(( $# > 2 ? 2 : $# ))
bin="${STREAMGATE_BIN:-target/release/streamgate}"   # another build to compare against
[ -x "$bin" ] || { echo "no $bin: run cargo build --release first" >&2; exit 2; }

# family → the fixture grown for it (one with reasoning where the family has it).
declare -A fixture=(
  [f1]=fixtures/f1/zero-text.sse
  [f1e]=fixtures/f1e/thinking.jsonl
  [f2]=fixtures/f2/deepseek-thinking.sse
  [f3]=fixtures/f3/reasoning.sse
  [f5]=fixtures/f5/thinking.sse
  [ollama-native]=fixtures/ollama-native/text.jsonl
  [codex-appserver]=fixtures/codex-appserver/reasoning.jsonl
  [codex-exec]=fixtures/codex-exec/answer.jsonl
  [openclaw-events]=fixtures/openclaw-events/answer.jsonl
  [acp]=fixtures/acp/answer.jsonl
)
families=("$@")
[ ${#families[@]} -gt 0 ] || families=(f1 f1e f2 f3 f5 ollama-native codex-appserver codex-exec openclaw-events acp)

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -n "${INSTRUCTIONS:-}" ]; then
  command -v valgrind >/dev/null || { echo "INSTRUCTIONS=1 needs valgrind" >&2; exit 2; }
  printf '%-16s %10s %14s %10s  %s\n' family "MiB" "instructions" "per byte" fixture
else
  printf '%-16s %10s %10s %12s %12s %10s %6s  %s\n' family "MiB" "MB/s" "peak RSS" "runs MB/s" "JSON MB/s" share fixture
fi
if [ -z "${INSTRUCTIONS:-}" ]; then
  # The floor under every peak RSS below: the process with no run at all (its mapped
  # binary pages and allocator). It depends on the page cache: the kernel maps a faulted
  # page's cached neighbours too, so a binary just built (all of it cached) reads a few
  # MiB higher than one the cache has dropped (docs/performance.md, eighth stop).
  floor=$( { /usr/bin/time -f '%M' "$bin" --version >/dev/null; } 2>&1 | tail -1)
  printf '%-16s %10s %10s %9.1f MiB %12s %10s %6s  %s\n' "(no run)" - - "$(awk -v k="$floor" 'BEGIN {print k/1024}')" - - - "$bin --version"
fi
for family in "${families[@]}"; do
  src="${fixture[$family]:?unknown family $family}"
  big="$tmp/$family.capture"
  "$bin" synth "$src" --mib "$size" -o "$big" >/dev/null 2>&1
  bytes=$(stat -c %s "$big")
  if [ -n "${INSTRUCTIONS:-}" ]; then
    ir=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" normalize \
      --family "$family" "$big" 2>&1 >/dev/null | sed -n 's/.*Collected : \([0-9]*\).*/\1/p')
    printf '%-16s %10.1f %14s %10.1f  %s\n' "$family" "$(awk -v b="$bytes" 'BEGIN {print b/1048576}')" \
      "$ir" "$(awk -v i="$ir" -v b="$bytes" 'BEGIN {print i/b}')" "$src"
    rm -f "$big"
    continue
  fi
  secs=()
  json=()
  peak=0
  for _ in $(seq "$runs"); do
    # Wall time from bash's microsecond clock: /usr/bin/time's 10 ms steps are 7% of a
    # 100 MiB run at 650 MB/s. /usr/bin/time still gives the peak RSS.
    t0=$EPOCHREALTIME
    kib=$( { /usr/bin/time -f '%M' "$bin" normalize --family "$family" "$big" >/dev/null; } 2>&1 | tail -1)
    t1=$EPOCHREALTIME
    secs+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f", b - a}')")
    (( kib > peak )) && peak=$kib
    # The baseline right after, so both see the machine of the same moment.
    t0=$EPOCHREALTIME
    "$bin" bench json "$big" >/dev/null
    t1=$EPOCHREALTIME
    json+=("$(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.6f", b - a}')")
  done
  # The median, and the slowest and fastest run: this machine kind's speed moves by a
  # quarter from one minute to the next (docs/performance.md), which the range shows.
  median_of() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  sorted=$(printf '%s\n' "${secs[@]}" | sort -g)
  median=$(median_of "${secs[@]}")
  rate() { awk -v b="$bytes" -v s="$1" 'BEGIN {printf "%.0f", (s > 0 ? b / s / 1e6 : 0)}'; }
  mbps=$(rate "$median")
  json_mbps=$(rate "$(median_of "${json[@]}")")
  share=$(awk -v a="$mbps" -v j="$json_mbps" 'BEGIN {printf "%.0f%%", (j > 0 ? 100 * a / j : 0)}')
  range="$(rate "$(tail -1 <<<"$sorted")")-$(rate "$(head -1 <<<"$sorted")")"
  printf '%-16s %10.1f %10s %9.1f MiB %12s %10s %6s  %s\n' "$family" "$(awk -v b="$bytes" 'BEGIN {print b/1048576}')" \
    "$mbps" "$(awk -v k="$peak" 'BEGIN {print k/1024}')" "$range" "$json_mbps" "$share" "$src"
  rm -f "$big"
done
