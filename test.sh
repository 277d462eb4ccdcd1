#!/usr/bin/env bash
# The project's test command. Idempotent: on a fresh Debian 12 machine (with
# Python 3.11, Java 17, Maven and cargo) it installs what the tests need, then
# builds the workspace, runs the Rust tests and the integration tests against
# a real `oncelog serve` with third-party clients. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$PWD"

step() { printf '\n==> %s\n' "$*"; }

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
  SUDO=(sudo)
fi

apt_install() {
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

hash_of() { sha256sum "$@" | sha256sum | cut -d' ' -f1; }

# Run a noisy setup command; show its output only if it fails.
quiet() {
  local out
  out="$(mktemp)"
  if ! "$@" >"$out" 2>&1; then
    cat "$out" >&2
    rm -f "$out"
    echo "failed: $*" >&2
    return 1
  fi
  rm -f "$out"
}

# --- system packages --------------------------------------------------------
# librdkafka (the auditor's workload client) is built from source by cargo:
# it needs a C toolchain, make and zlib's headers.
if ! { command -v make && command -v cc && [ -e /usr/include/zlib.h ]; } >/dev/null 2>&1; then
  step "installing build tools for librdkafka"
  apt_install build-essential zlib1g-dev
fi
if ! command -v kcat >/dev/null 2>&1; then
  step "installing kcat"
  apt_install kcat
fi

# --- Python clients ---------------------------------------------------------
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
  step "creating $VENV"
  rm -rf "$VENV"
  if ! python3 -m venv "$VENV" >/dev/null 2>&1; then
    # Debian's python3 needs python3-venv for ensurepip.
    rm -rf "$VENV"
    apt_install python3-venv
    python3 -m venv "$VENV"
  fi
fi
REQ_HASH="$(hash_of tests/requirements.txt)"
if [ "$(cat "$VENV/.requirements.sha256" 2>/dev/null || true)" != "$REQ_HASH" ]; then
  step "installing tests/requirements.txt"
  quiet "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r tests/requirements.txt
  echo "$REQ_HASH" >"$VENV/.requirements.sha256"
fi

# --- Java client jars (kafka-clients + slf4j-nop into .tools/java-lib) -------
JAVA_LIB="$ROOT/.tools/java-lib"
POM_HASH="$(hash_of tests/java/pom.xml)"
if [ "$(cat "$JAVA_LIB/.pom.sha256" 2>/dev/null || true)" != "$POM_HASH" ]; then
  step "fetching Java client jars"
  rm -rf "$JAVA_LIB"
  quiet mvn -q -B -f tests/java/pom.xml dependency:copy-dependencies
  echo "$POM_HASH" >"$JAVA_LIB/.pom.sha256"
fi

# --- Kafka Streams jars (kafka-streams + slf4j-simple into .tools/streams-lib),
# for the exactly-once Streams test (tests/test_streams.py) -------------------
STREAMS_LIB="$ROOT/.tools/streams-lib"
SPOM_HASH="$(hash_of tests/streams/pom.xml)"
if [ "$(cat "$STREAMS_LIB/.pom.sha256" 2>/dev/null || true)" != "$SPOM_HASH" ]; then
  step "fetching Kafka Streams jars"
  rm -rf "$STREAMS_LIB"
  quiet mvn -q -B -f tests/streams/pom.xml dependency:copy-dependencies
  echo "$SPOM_HASH" >"$STREAMS_LIB/.pom.sha256"
fi

# --- Flink jars (Flink 2.2's DataStream runtime for a MiniCluster, the Kafka
# connector and slf4j-simple into .tools/flink-lib), for the exactly-once
# Flink tests (tests/test_flink.py) ---------------------------------------------
FLINK_LIB="$ROOT/.tools/flink-lib"
FPOM_HASH="$(hash_of tests/flink/pom.xml)"
if [ "$(cat "$FLINK_LIB/.pom.sha256" 2>/dev/null || true)" != "$FPOM_HASH" ]; then
  step "fetching Flink jars"
  rm -rf "$FLINK_LIB"
  quiet mvn -q -B -f tests/flink/pom.xml dependency:copy-dependencies
  echo "$FPOM_HASH" >"$FLINK_LIB/.pom.sha256"
fi

# --- Apache Kafka reference broker and kafka-tools jars (.tools/kafka-lib), for
# the differential conformance tests, the kafka-transactions tool check
# (tests/test_kafka_tools.py) and `bench/produce_bench.py --kafka` -----------
KAFKA_LIB="$ROOT/.tools/kafka-lib"
KPOM_HASH="$(hash_of bench/kafka/pom.xml)"
if [ "$(cat "$KAFKA_LIB/.pom.sha256" 2>/dev/null || true)" != "$KPOM_HASH" ]; then
  step "fetching Apache Kafka broker jars"
  rm -rf "$KAFKA_LIB"
  quiet mvn -q -B -f bench/kafka/pom.xml dependency:copy-dependencies
  echo "$KPOM_HASH" >"$KAFKA_LIB/.pom.sha256"
fi

# --- Rust -------------------------------------------------------------------
step "cargo build --release --workspace"
cargo build --release --workspace

step "cargo test --release --workspace"
cargo test --release --workspace

# --- fuzzing: a short run of every cargo-fuzz target (fuzz/README.md) --------
step "fuzz smoke run (${FUZZ_SECONDS:-20} s per target)"
fuzz_status=0
bash fuzz/run.sh "${FUZZ_SECONDS:-20}" || fuzz_status=$?

# --- integration tests --------------------------------------------------------
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export ONCELOG_BIN="${ONCELOG_BIN:-$TARGET_DIR/release/oncelog}"
step "pytest tests (broker: $ONCELOG_BIN)"
PYTEST_LOG="$(mktemp)"
set +e
"$VENV/bin/pytest" -v tests 2>&1 | tee "$PYTEST_LOG"
status=${PIPESTATUS[0]}
set -e
# Clients left behind by a test may log after pytest's summary; repeat the
# counts as the very last line so the result is easy to find.
summary="$(grep -E '^=+ .*[0-9]+ (passed|failed|error)' "$PYTEST_LOG" | tail -n 1)"
rm -f "$PYTEST_LOG"
count() { printf '%s\n' "$summary" | grep -oE "[0-9]+ $1" | grep -oE '[0-9]+' || echo 0; }
passed="$(count passed)"
failed=$(( $(count failed) + $(count "errors?") ))
skipped="$(count skipped)"
echo
if [ "$fuzz_status" -ne 0 ]; then
  echo "fuzz: a target failed (exit $fuzz_status); see fuzz/artifacts/"
  [ "$status" -eq 0 ] && status=$fuzz_status
fi
if [ "$skipped" -gt 0 ]; then
  echo "pytest: $passed passed, $failed failed, $skipped skipped"
else
  echo "pytest: $passed passed, $failed failed"
fi
exit "$status"
