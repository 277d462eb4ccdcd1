#!/usr/bin/env bash
# Starts or stops the two services cluster mode's tests use, in a directory of
# their own, on loopback ports:
#   * a PostgreSQL server (Debian's package; initdb in DIR/pg, trust auth for
#     loopback clients only),
#   * s3proxy, an S3-compatible server backed by DIR/s3 (jars in
#     .tools/s3proxy-lib, fetched by test.sh), with the bucket `oncelog`.
#
#   eval "$(bash scripts/services.sh start DIR)"   # prints the exports below
#   bash scripts/services.sh stop DIR
#
# Exports ONCELOG_TEST_PG (a postgres:// URL) and ONCELOG_TEST_S3_ENDPOINT,
# ONCELOG_TEST_S3_BUCKET, ONCELOG_TEST_S3_KEY, ONCELOG_TEST_S3_SECRET.
#
# They listen on 127.0.0.1 unless ONCELOG_SERVICES_PG_HOST or
# ONCELOG_SERVICES_S3_HOST name another loopback address (tests/hosts.py's
# hosts); PostgreSQL trusts every 127.0.0.0/8 client.
set -euo pipefail
cmd="${1:?start|stop}"
dir="${2:?DIR}"
pg_host="${ONCELOG_SERVICES_PG_HOST:-127.0.0.1}"
s3_host="${ONCELOG_SERVICES_S3_HOST:-127.0.0.1}"
root="$(cd "$(dirname "$0")/.." && pwd)"

pg_bin() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [ -n "$d" ] || { echo "services.sh: no PostgreSQL server (apt-get install postgresql)" >&2; exit 1; }
  echo "$d"
}

# initdb and postgres refuse to run as root: run them as the postgres user.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

free_port() {  # host
  python3 -c "import socket; s=socket.socket(); s.bind(('$1',0)); print(s.getsockname()[1])"
}

wait_port() {  # host, port, what, log
  for _ in $(seq 1 300); do
    if python3 -c "import socket,sys; socket.create_connection(('$1',$2),0.2)" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "services.sh: $3 did not listen on $1:$2; its log:" >&2
  tail -n 40 "$4" >&2 || true
  exit 1
}

stop_all() {
  [ -d "$dir" ] || return 0
  if [ -e "$dir/s3proxy.pid" ]; then
    kill "$(cat "$dir/s3proxy.pid")" 2>/dev/null || true
    rm -f "$dir/s3proxy.pid"
  fi
  if [ -e "$dir/pg/postmaster.pid" ]; then
    as_pg "$(pg_bin)/pg_ctl" -D "$dir/pg" -m fast -w stop >/dev/null 2>&1 || true
  fi
}

case "$cmd" in
start)
  # started before in this directory: stop those first (a second start
  # gives fresh ports and the same data)
  stop_all
  mkdir -p "$dir"
  dir="$(cd "$dir" && pwd)"
  bin="$(pg_bin)"
  mkdir -p "$dir/pg"
  [ "$(id -u)" -eq 0 ] && chown postgres "$dir" "$dir/pg"
  chmod 755 "$dir"
  if [ ! -e "$dir/pg/PG_VERSION" ]; then
    as_pg "$bin/initdb" -D "$dir/pg" -A trust -U postgres --no-sync >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; exit 1; }
    echo "host all all 127.0.0.0/8 trust" >>"$dir/pg/pg_hba.conf"
  fi
  pg_port="$(free_port "$pg_host")"
  as_pg "$bin/pg_ctl" -D "$dir/pg" -l "$dir/pg.log" -w -t 60 \
    -o "-c listen_addresses=$pg_host -p $pg_port -k $dir/pg -c max_connections=600 -c fsync=on" \
    start >/dev/null
  wait_port "$pg_host" "$pg_port" PostgreSQL "$dir/pg.log"
  echo "$pg_port" >"$dir/pg.port"

  lib="$root/.tools/s3proxy-lib"
  [ -d "$lib" ] || { echo "services.sh: no $lib (test.sh fetches it)" >&2; exit 1; }
  mkdir -p "$dir/s3/oncelog"
  s3_port="$(free_port "$s3_host")"
  cat >"$dir/s3proxy.conf" <<EOF
s3proxy.endpoint=http://$s3_host:$s3_port
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity=oncelog
s3proxy.credential=oncelog-secret
jclouds.provider=filesystem
jclouds.filesystem.basedir=$dir/s3
EOF
  # Warnings only: without a configuration logback logs every request's
  # Jetty internals at DEBUG, which under a parallel test run filled the
  # heap and stalled every PUT behind the collector.
  cat >"$dir/s3proxy-logback.xml" <<'XML'
<configuration>
  <appender name="STDERR" class="ch.qos.logback.core.ConsoleAppender">
    <target>System.err</target>
    <encoder><pattern>%d{HH:mm:ss.SSS} %-5level %logger{36} - %msg%n</pattern></encoder>
  </appender>
  <root level="WARN"><appender-ref ref="STDERR"/></root>
</configuration>
XML
  nohup java -Xms64m -Xmx512m -XX:+UseSerialGC -Dlogback.configurationFile="$dir/s3proxy-logback.xml" \
    -cp "$lib/*" org.gaul.s3proxy.Main \
    --properties "$dir/s3proxy.conf" >"$dir/s3proxy.log" 2>&1 </dev/null &
  echo $! >"$dir/s3proxy.pid"
  wait_port "$s3_host" "$s3_port" s3proxy "$dir/s3proxy.log"
  echo "$s3_port" >"$dir/s3.port"

  echo "export ONCELOG_TEST_PG=postgres://postgres@$pg_host:$pg_port/postgres"
  echo "export ONCELOG_TEST_PG_BIN=$bin ONCELOG_TEST_PG_DIR=$dir/pg"
  echo "export ONCELOG_TEST_S3_ENDPOINT=http://$s3_host:$s3_port"
  echo "export ONCELOG_TEST_S3_BUCKET=oncelog ONCELOG_TEST_S3_KEY=oncelog ONCELOG_TEST_S3_SECRET=oncelog-secret"
  echo "export ONCELOG_TEST_S3_DIR=$dir/s3 ONCELOG_TEST_S3_PID=$(cat "$dir/s3proxy.pid")"
  ;;
stop)
  stop_all
  ;;
*)
  echo "usage: services.sh start|stop DIR" >&2
  exit 2
  ;;
esac
