#!/usr/bin/env bash
# Runs every fuzz target for SECONDS (default 20) on its committed seeds plus
# the local working corpus (fuzz/corpus/<target>, kept between runs), with
# `cargo fuzz -s none` on the stable toolchain. Prints the executions per
# target; exits non-zero if any target crashed, ran out of memory or timed out
# (the input is left in fuzz/artifacts/<target>/).
#
#   fuzz/run.sh            # 20 s per target
#   fuzz/run.sh 600        # a longer run
#   TARGETS="batch_header segment_recovery" fuzz/run.sh 60
#
# Build parallelism follows cargo's usual settings (e.g. CARGO_BUILD_JOBS=1).
set -euo pipefail
SECONDS_PER_TARGET="${1:-20}"
FUZZ_DIR="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$FUZZ_DIR")"
cd "$ROOT"

CARGO_FUZZ_VERSION=0.13.2
ALL_TARGETS="frame_split request_decode batch_header segment_recovery snapshot_load sasl_session tls_framing"
TARGETS="${TARGETS:-$ALL_TARGETS}"
# Memory caps for one fuzzing process. Without a sanitizer (-s none) libFuzzer
# cannot hook malloc, so -malloc_limit_mb only applies where it can; the RSS
# limit always does.
RSS_LIMIT_MB="${RSS_LIMIT_MB:-2048}"

if ! cargo fuzz --version 2>/dev/null | grep -q "cargo-fuzz $CARGO_FUZZ_VERSION\b"; then
  echo "==> installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

# Never the main workspace's target dir, whatever CARGO_TARGET_DIR says.
FUZZ_ARGS=(-s none --target-dir "$FUZZ_DIR/target" --fuzz-dir "$FUZZ_DIR")

echo "==> cargo fuzz build (all targets)"
build_start=$(date +%s)
cargo fuzz build "${FUZZ_ARGS[@]}"
echo "    built in $(( $(date +%s) - build_start )) s"

# Scratch files of segment_recovery and snapshot_load go to /dev/shm when
# there is one (see fuzz/src/lib.rs); ONCELOG_FUZZ_TMP overrides.
LOGS="$(mktemp -d)"
trap 'rm -rf "$LOGS"' EXIT
failed=()
for t in $TARGETS; do
  mkdir -p "$FUZZ_DIR/corpus/$t" "$FUZZ_DIR/artifacts/$t"
  seeds=()
  [ -d "$FUZZ_DIR/seeds/$t" ] && seeds=("$FUZZ_DIR/seeds/$t")
  echo "==> $t for ${SECONDS_PER_TARGET} s"
  set +e
  cargo fuzz run "${FUZZ_ARGS[@]}" "$t" "$FUZZ_DIR/corpus/$t" "${seeds[@]}" -- \
    -max_total_time="$SECONDS_PER_TARGET" \
    -rss_limit_mb="$RSS_LIMIT_MB" -malloc_limit_mb="$RSS_LIMIT_MB" \
    -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$FUZZ_DIR/artifacts/$t/" >"$LOGS/$t.log" 2>&1
  rc=$?
  set -e
  # (no count when the target did not even start: not a reason to stop here)
  runs="$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$LOGS/$t.log" | grep -oE '[0-9]+$' | tail -n1 || true)"
  corpus="$(find "$FUZZ_DIR/corpus/$t" -type f | wc -l)"
  if [ "$rc" -eq 0 ]; then
    echo "    $t: ok, ${runs:-?} runs, corpus $corpus files"
  else
    echo "    $t: FAILED (exit $rc) after ${runs:-?} runs; log tail:"
    tail -n 40 "$LOGS/$t.log" | sed 's/^/      /'
    echo "    artifacts: $(ls "$FUZZ_DIR/artifacts/$t" | tr '\n' ' ')"
    echo "    reproduce: cargo fuzz run -s none --target-dir fuzz/target $t fuzz/artifacts/$t/<file>"
    failed+=("$t")
  fi
done

if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz: ${#failed[@]} of $(wc -w <<<"$TARGETS") targets failed: ${failed[*]}"
  exit 1
fi
echo "fuzz: all $(wc -w <<<"$TARGETS") targets ran ${SECONDS_PER_TARGET} s without a failure"
