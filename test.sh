#!/usr/bin/env bash
# The project's test command. Idempotent: on a fresh Debian 12 machine (with
# Python 3.11, Java 17, Maven and cargo) it installs what the tests need, then
# builds the workspace, runs the Rust tests and the integration tests against
# a real `oncelog serve` with third-party clients. Exits non-zero on any failure.
#
#   bash test.sh           # everything, as CI runs it
#   bash test.sh --quick   # the developers' loop: cargo test and the `quick`
#                          # subset of tests/ (tests/conftest.py), no fuzzing
#   PYTEST_WORKERS=N       # pytest-xdist workers (default 4, see below)
set -euo pipefail
cd "$(dirname "$0")"
ROOT="$PWD"
QUICK=0
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=1 ;;
    *) echo "usage: bash test.sh [--quick]" >&2; exit 2 ;;
  esac
done

# every step names the time since the start, so a slow step shows in the log
step() { printf '\n==> [%ss] %s\n' "$SECONDS" "$*"; }

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
# it needs a C toolchain, make, pkg-config and zlib's and OpenSSL's headers.
if ! { command -v make && command -v cc && command -v pkg-config && [ -e /usr/include/zlib.h ] \
       && [ -e /usr/include/openssl/ssl.h ]; } >/dev/null 2>&1; then
  step "installing build tools for librdkafka"
  apt_install build-essential zlib1g-dev libssl-dev pkg-config
fi
VENV="$ROOT/.venv"
# --- what the tests need besides the build: installed in the background while
# cargo builds (apt and Maven wait on the network, cargo on the CPU) --------
install_test_tools() {
  if ! command -v kcat >/dev/null 2>&1; then
    step "installing kcat"
    apt_install kcat
  fi
  # the README's quickstart runs in a network namespace of its own (ip, unshare)
  if ! { command -v ip && command -v unshare; } >/dev/null 2>&1; then
    step "installing iproute2 and util-linux"
    apt_install iproute2 util-linux
  fi
  # the console tests drive headless Chromium through its WebDriver
  if ! { command -v chromium && command -v chromedriver; } >/dev/null 2>&1; then
    step "installing chromium and chromium-driver"
    apt_install chromium chromium-driver
  fi

  # cluster mode's tests run a real PostgreSQL server (scripts/services.sh)
  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    step "installing postgresql"
    apt_install postgresql
  fi
  # its hosts apart cut links with nftables (tests/hosts.py) and step a
  # broker's wall clock with libfaketime (tests/cluster_audit.py)
  if ! { command -v nft && ls /usr/lib/*/faketime/libfaketimeMT.so.1; } >/dev/null 2>&1; then
    step "installing nftables and faketime"
    apt_install nftables faketime
  fi

  # --- Python clients ---------------------------------------------------------
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

  # --- Jars fetched with Maven into .tools/<dir> (ignored by git), each again
  # only when its pom changes ---------------------------------------------------
  fetch_jars() {  # pom.xml, lib dir, what
    local pom="$1" lib="$2" what="$3" want
    want="$(hash_of "$pom")"
    if [ "$(cat "$lib/.pom.sha256" 2>/dev/null || true)" != "$want" ]; then
      step "fetching $what"
      rm -rf "$lib"
      quiet mvn -q -B -f "$pom" dependency:copy-dependencies
      echo "$want" >"$lib/.pom.sha256"
    fi
  }
  # the Java client tests: kafka-clients + slf4j-nop
  fetch_jars tests/java/pom.xml "$ROOT/.tools/java-lib" "Java client jars"
  # the exactly-once Streams tests (tests/test_streams*.py): kafka-streams + slf4j-simple
  fetch_jars tests/streams/pom.xml "$ROOT/.tools/streams-lib" "Kafka Streams jars"
  # the exactly-once Flink tests (tests/test_flink.py): Flink 2.2's DataStream
  # runtime for a MiniCluster, the Kafka connector and slf4j-simple
  fetch_jars tests/flink/pom.xml "$ROOT/.tools/flink-lib" "Flink jars"
  # the Apache Kafka reference broker and kafka-tools: the differential tests,
  # Kafka's own kafka-transactions, kafka-configs and kafka-acls tools, and
  # `bench/produce_bench.py --kafka`
  fetch_jars bench/kafka/pom.xml "$ROOT/.tools/kafka-lib" "Apache Kafka broker jars"
  # s3proxy, the S3-compatible server cluster mode's tests write objects to
  fetch_jars tests/s3proxy/pom.xml "$ROOT/.tools/s3proxy-lib" "s3proxy jars"
}
TOOLS_LOG="$(mktemp)"
step "installing the test clients and tools in the background (log shown when done)"
install_test_tools >"$TOOLS_LOG" 2>&1 &
TOOLS_PID=$!
wait_test_tools() {
  local rc=0
  wait "$TOOLS_PID" || rc=$?
  sed 's/^/    /' "$TOOLS_LOG"
  rm -f "$TOOLS_LOG"
  if [ "$rc" -ne 0 ]; then
    echo "installing the test clients and tools failed (exit $rc)" >&2
    exit "$rc"
  fi
}

# --- Rust -------------------------------------------------------------------
step "cargo build --release --workspace"
cargo build --release --workspace

step "waiting for the test clients and tools"
wait_test_tools

# --- services: PostgreSQL and s3proxy on loopback, in a directory of this
# run, stopped when the run ends -----------------------------------------------
SERVICES_DIR="$(mktemp -d "${TMPDIR:-/tmp}/oncelog-services.XXXXXX")"
stop_services() {
  bash "$ROOT/scripts/services.sh" stop "$SERVICES_DIR" || true
  rm -rf "$SERVICES_DIR"
}
trap stop_services EXIT
step "starting PostgreSQL and s3proxy ($SERVICES_DIR)"
SERVICES_ENV="$(bash scripts/services.sh start "$SERVICES_DIR")"
eval "$SERVICES_ENV"
printf '%s\n' "$SERVICES_ENV" | grep -oE 'ONCELOG_TEST_(PG|S3_ENDPOINT)=[^ ]+'

step "cargo test --release --workspace"
cargo test --release --workspace

# --- fuzzing: a short run of every cargo-fuzz target (fuzz/README.md) --------
fuzz_status=0
if [ "$QUICK" -eq 0 ]; then
  step "fuzz smoke run (${FUZZ_SECONDS:-20} s per target)"
  bash fuzz/run.sh "${FUZZ_SECONDS:-20}" || fuzz_status=$?
fi

# --- integration tests --------------------------------------------------------
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
export ONCELOG_BIN="${ONCELOG_BIN:-$TARGET_DIR/release/oncelog}"
# Most tests wait (broker and JVM start-ups, session timeouts, fault windows,
# long polls), so they run in parallel: pytest-xdist workers, with every heavy
# test in one xdist group (at most one at a time, tests/conftest.py).
# Measured on 2 cores: see docs/testing.md.
WORKERS="${PYTEST_WORKERS:-4}"
PYTEST_ARGS=(-n "$WORKERS" --dist loadgroup -v --durations=25)
[ "$QUICK" -eq 1 ] && PYTEST_ARGS+=(-m quick)
step "pytest tests, $WORKERS workers (broker: $ONCELOG_BIN)"
PYTEST_LOG="$(mktemp)"
set +e
"$VENV/bin/pytest" "${PYTEST_ARGS[@]}" tests 2>&1 | tee "$PYTEST_LOG"
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
echo "test.sh ran ${SECONDS} s"
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
