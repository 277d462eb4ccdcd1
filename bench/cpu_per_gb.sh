#!/usr/bin/env bash
# Broker CPU for a fixed amount of durable produce: starts a fresh broker,
# sends N messages of SIZE bytes with one `oncelog bench-load` producer
# (idempotent, acks=all) and prints the broker's CPU seconds (user+sys, from
# /proc) and CPU seconds per GB of payload. A fixed amount of work, not a
# time window, so two binaries or two settings compare directly; run it a
# few times and compare medians.
#
#   bash bench/cpu_per_gb.sh [N] [SIZE] [PARTITIONS]      (default 1500000 1024 1)
#   ONCELOG_BIN=/path/to/oncelog bash bench/cpu_per_gb.sh
#   BROKER_ENV="MALLOC_MMAP_THRESHOLD_=131072" bash bench/cpu_per_gb.sh
set -euo pipefail
N=${1:-1500000}
SIZE=${2:-1024}
PARTS=${3:-1}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${ONCELOG_BIN:-$ROOT/target/release/oncelog}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/oncelog-cpu.XXXXXX")
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
BP=
cleanup() {
  if [ -n "$BP" ]; then kill "$BP" 2>/dev/null || true; wait "$BP" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
# shellcheck disable=SC2086
env ${BROKER_ENV:-} "$BIN" serve --data-dir "$WORK/data" --listen "127.0.0.1:$PORT" --metrics-listen '' \
  > "$WORK/broker.log" 2>&1 &
BP=$!
for _ in $(seq 100); do
  "$BIN" topic create t --partitions "$PARTS" --bootstrap "127.0.0.1:$PORT" > /dev/null 2>&1 && break
  sleep 0.1
done
sync
cpu() { awk '{print $14 + $15}' "/proc/$BP/stat"; }
c0=$(cpu)
t0=$(python3 -c 'import time; print(time.monotonic() + 0.3)')
res=$( (sleep 0.1; echo "go $t0 0 3600") | "$BIN" bench-load --topic t --partitions "$PARTS" --size "$SIZE" \
  --max-msgs "$N" --latency-file "$WORK/lat" --conf "bootstrap.servers=127.0.0.1:$PORT" --conf acks=all \
  --conf enable.idempotence=true --conf linger.ms=5 --conf batch.size=1000000 \
  --conf queue.buffering.max.messages=200000 --conf queue.buffering.max.kbytes=16384 | tail -1)
c1=$(cpu)
hz=$(getconf CLK_TCK)
python3 - "$res" "$c0" "$c1" "$hz" "$SIZE" <<'EOF'
import json, sys
r, c0, c1, hz, size = json.loads(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
if not r.get("ok") or r["errors"]:
    sys.exit(f"load failed: {r}")
el = r["t_stop"] - r["t_start"]
cpu = (c1 - c0) / hz
gb = r["acked_all"] * size / 1e9
print(f"{r['acked_all']} msgs x {size} B in {el:.2f} s ({r['acked_all'] / el:,.0f} msgs/s): "
      f"broker CPU {cpu:.2f} s = {cpu / gb:.2f} s/GB; load generator CPU {r['cpu_s']:.2f} s")
EOF
