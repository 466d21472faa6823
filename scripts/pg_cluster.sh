#!/usr/bin/env bash
# Start or stop a throwaway PostgreSQL cluster for the tests, on a loopback port.
# initdb refuses to run as root, so the cluster belongs to an unprivileged user.
# It runs with fsync=off (and initdb --no-sync) for unit-test speed ONLY: a crash of this
# cluster may lose committed transactions. Anything that crashes PostgreSQL on purpose and then
# checks exactly-once (the soak: broker/testing/pg_server.py) runs a durable cluster of its own,
# with fsync=on and synchronous_commit=on.
# Usage: pg_cluster.sh start|stop DATA_DIR PORT
set -euo pipefail
# start takes a 4th argument, MODE:
#   test (default): the unit tests' cluster, with fsync=off (and initdb --no-sync) for test speed
#     only: a commit there is not on disk when it returns, so no figure measured against it
#     says what a user's PostgreSQL does. Never benchmark against it.
#   durable: what a user runs, stated explicitly: fsync=on, synchronous_commit=on,
#     full_page_writes=on (benchmarks/bench_all.py starts one).
action=$1; dir=$2; port=$3; mode=${4:-test}
bin=/usr/lib/postgresql/15/bin
pg_user=postgres
abs=$(mkdir -p "$(dirname "$dir")" && cd "$(dirname "$dir")" && pwd)/$(basename "$dir")

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    id -u "$pg_user" >/dev/null 2>&1 || useradd --system --no-create-home "$pg_user"
    runuser -u "$pg_user" -- "$@"
  else
    "$@"
  fi
}

case "$action" in
start)
  if [ -f "$abs/postmaster.pid" ] && as_pg "$bin/pg_ctl" -D "$abs" status >/dev/null 2>&1; then
    echo "postgres already running in $abs"; exit 0
  fi
  case "$mode" in
  test) initdb_sync=--no-sync; settings="-c fsync=off" ;;
  durable) initdb_sync=; settings="-c fsync=on -c synchronous_commit=on -c full_page_writes=on" ;;
  *) echo "$0: mode must be test or durable (got '$mode')" >&2; exit 2 ;;
  esac
  rm -rf "$abs"; mkdir -p "$abs"
  [ "$(id -u)" = 0 ] && { id -u "$pg_user" >/dev/null 2>&1 || useradd --system --no-create-home "$pg_user"; chown "$pg_user" "$abs"; }
  as_pg "$bin/initdb" -D "$abs" -U gazette --auth=trust $initdb_sync -E UTF8 >/dev/null
  as_pg "$bin/pg_ctl" -D "$abs" -l "$abs/server.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $port -k $abs $settings -c max_connections=200" start >/dev/null
  as_pg "$bin/createdb" -h 127.0.0.1 -p "$port" -U gazette gazette
  echo "postgres ($mode) running on 127.0.0.1:$port (data in $abs)"
  ;;
stop)
  if [ -d "$abs" ]; then
    as_pg "$bin/pg_ctl" -D "$abs" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$abs"
  fi
  ;;
*) echo "usage: $0 start|stop DATA_DIR PORT [test|durable]" >&2; exit 2 ;;
esac
