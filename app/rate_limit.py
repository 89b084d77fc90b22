"""Submits per key per minute (TIDE_MAX_SUBMITS_PER_MINUTE_PER_KEY), so that no key can fill the
queue with jobs it cancels at once and so delay every other key's (issue 38).

A sliding window of 60 s in a Redis sorted set per key, shared by every API process: each submit
adds itself, and one that finds more than the limit in the window takes itself out again and is
answered 429 with Retry-After, the seconds until the oldest submit counted leaves the window. The
four commands run as one MULTI transaction, so parallel submits can never let more than the limit
through. Redis away: the submit is not counted (the job is stored, and sent when Redis is back).
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid

import redis

from .errors import ApiError
from .settings import Settings

log = logging.getLogger("tide.api")
WINDOW_S = 60


class SubmitRate:
    def __init__(self, settings: Settings):
        self.settings = settings
        self._client: redis.Redis | None = None
        self._lock = threading.Lock()

    def _redis(self) -> redis.Redis:
        with self._lock:
            if self._client is None:
                self._client = redis.Redis.from_url(self.settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
            return self._client

    def check(self, key_id: str) -> None:
        """Count one submit of this key; ApiError 429 when it is over the limit."""
        limit = self.settings.max_submits_per_minute_per_key
        if limit == 0:
            return
        name = f"tide:submits:{self.settings.queue}:{key_id}"
        now = time.time()
        member = f"{now:.6f}:{uuid.uuid4().hex[:8]}"
        try:
            client = self._redis()
            pipe = client.pipeline(transaction=True)
            pipe.zremrangebyscore(name, "-inf", now - WINDOW_S)
            pipe.zadd(name, {member: now})
            pipe.zcard(name)
            pipe.zrange(name, 0, 0, withscores=True)
            pipe.expire(name, WINDOW_S + 1)
            _removed, _added, count, oldest, _expire = pipe.execute()
            if count <= limit:
                return
            client.zrem(name, member)
        except redis.RedisError as exc:
            log.warning("submit of key %s not counted against its rate limit: Redis: %s", key_id, exc)
            return
        retry = max(1, math.ceil(oldest[0][1] + WINDOW_S - now)) if oldest else WINDOW_S
        raise ApiError(
            429, "too_many_submits",
            f"this API key has submitted {limit} jobs in the last {WINDOW_S} s, its limit "
            f"(TIDE_MAX_SUBMITS_PER_MINUTE_PER_KEY); retry in {retry} s",
            None, {"Retry-After": str(retry)},
        )

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None
