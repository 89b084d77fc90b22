#!/usr/bin/env bash
# Start a local Redis on 127.0.0.1:6379 unless one already answers (the service tests need it).
set -euo pipefail
if redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  exit 0
fi
mkdir -p /tmp/tide-redis
redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
  --dir /tmp/tide-redis --logfile /tmp/tide-redis/redis.log
for _ in $(seq 50); do
  redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 && exit 0
  sleep 0.2
done
echo "ensure-redis: redis-server did not answer on 127.0.0.1:6379 (see /tmp/tide-redis/redis.log)" >&2
exit 1
