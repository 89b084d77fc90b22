#!/usr/bin/env bash
# Entrypoint of the TIDE image: `tide` subcommands run as they are named (serve, worker, keys,
# extend, mine); anything else runs as given, so `docker compose run api bash` still works.
set -euo pipefail

here="$(dirname "$(readlink -f "$0")")"

# Volumes created by hand or on shared storage may lack the folders the image makes; checking here
# turns a permission problem into one clear line at start-up instead of a failed job later.
for dir in "${TIDE_DATA_DIR:-/data}" "${TIDE_CACHE_DIR:-/cache/tide}" "${HF_HOME:-/cache/hf}"; do
  if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
    echo "tide-entrypoint: $dir is not writable by uid $(id -u); chown the volume to $(id -u):$(id -g)" >&2
    exit 1
  fi
done

# The API creates its tables at start and a worker claims jobs in the database: wait for a database
# that is still starting (the postgres profile) or remote (a GPU host), for DB_WAIT_S seconds.
wait_for_database() {
  # Microseconds from EPOCHREALTIME: bash's SECONDS ticks on wall-clock second boundaries, so a
  # deadline built from it can fire up to a second early.
  local deadline=$((${EPOCHREALTIME/./} + ${DB_WAIT_S:-90} * 1000000)) problem
  until problem="$(python "$here/healthcheck.py" database 2>&1)"; do
    if [ "${EPOCHREALTIME/./}" -ge "$deadline" ]; then
      echo "tide-entrypoint: gave up waiting for the database after ${DB_WAIT_S:-90} s: $problem" >&2
      exit 1
    fi
    sleep 2
  done
}

case "${1:-}" in
  serve | worker)
    wait_for_database
    exec tide "$@"
    ;;
  keys | extend | mine)
    exec tide "$@"
    ;;
  "")
    wait_for_database
    exec tide serve --host 0.0.0.0 --port 8000
    ;;
  *)
    exec "$@"
    ;;
esac
