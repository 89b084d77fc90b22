#!/usr/bin/env bash
# Entrypoint of the TIDE image: `tide` subcommands run as they are named (serve, worker, keys,
# extend, mine); anything else runs as given, so `docker compose run api bash` still works.
set -euo pipefail

# Volumes that were created by hand or on shared storage may lack the folders the image makes;
# creating them here turns a permission problem into a clear message at start-up instead of a
# failed job later.
for dir in "${TIDE_DATA_DIR:-/data}" "${TIDE_CACHE_DIR:-/cache/tide}" "${HF_HOME:-/cache/hf}"; do
  if ! mkdir -p "$dir" 2>/dev/null || [ ! -w "$dir" ]; then
    echo "tide-entrypoint: $dir is not writable by uid $(id -u); chown the volume to $(id -u):$(id -g)" >&2
    exit 1
  fi
done

case "${1:-}" in
  serve | worker | keys | extend | mine)
    exec tide "$@"
    ;;
  "")
    exec tide serve --host 0.0.0.0 --port 8000
    ;;
  *)
    exec "$@"
    ;;
esac
