"""The API's side of the job queue: send a job id, see which job ids wait, count the workers."""

from __future__ import annotations

import base64
import json

import redis
from kombu.serialization import loads

from .settings import Settings


class JobQueue:
    def __init__(self, settings: Settings):
        from worker.celery_app import make_celery

        self.settings = settings
        self.celery = make_celery(settings)

    def send(self, job_id: str, base_model: str | None = None) -> None:
        from worker.celery_app import TASK_NAME

        self.celery.send_task(TASK_NAME, args=[job_id], queue=self.settings.queue_for(base_model))

    def waiting_job_ids(self, queue: str) -> set[str]:
        """Job ids whose messages wait in this queue, not yet taken by a worker.

        Redis keeps them in a list named after the queue (TIDE never sets a message priority, so
        kombu's per-priority lists stay empty); each one is decoded by kombu itself. A message a
        worker has taken (running, or a worker that died holding it) is not in the list."""
        with self.celery.connection_for_read() as connection:
            channel = connection.default_channel
            job_ids = set()
            for raw in channel.client.lrange(queue, 0, -1):
                job_id = _job_id_of(channel, raw)
                if job_id is not None:
                    job_ids.add(job_id)
            return job_ids

    def drop(self, job_id: str, base_model: str | None = None) -> int:
        """Take a cancelled or deleted job's waiting messages out of its queue (LREM of each), so
        no worker spends a process on them (issue 38); returns how many. A message a worker has
        already taken is not in the list: the worker's parent drops it (worker/tasks.py)."""
        queue = self.settings.queue_for(base_model)
        # A plain client with timeouts: a cancel never waits long on a Redis that is away.
        client = redis.Redis.from_url(self.settings.redis_url, socket_timeout=5, socket_connect_timeout=5)
        try:
            removed = 0
            for raw in client.lrange(queue, 0, -1):
                if _job_id_of(None, raw) == job_id:
                    removed += client.lrem(queue, 1, raw)
            return removed
        finally:
            client.close()

    def ping_redis(self) -> None:
        client = redis.Redis.from_url(self.settings.redis_url, socket_timeout=self.settings.readyz_timeout_s, socket_connect_timeout=self.settings.readyz_timeout_s)
        try:
            client.ping()
        finally:
            client.close()

    def workers(self) -> int:
        """Workers that answer within the timeout and consume this deployment's queue."""
        replies = self.celery.control.inspect(timeout=self.settings.readyz_timeout_s).active_queues() or {}
        return sum(1 for queues in replies.values() if any(q.get("name") == self.settings.queue for q in queues or ()))

    def close(self) -> None:
        self.celery.close()


def _job_id_of(channel, raw: bytes) -> str | None:
    """The job id a queued message carries, decoded by kombu itself (without a channel: its Redis
    transport's envelope, a base64 body); None for anything else."""
    try:
        if channel is not None:
            args = channel.Message(json.loads(raw), channel=channel).decode()[0]
        else:
            envelope = json.loads(raw)
            body = envelope["body"]
            if envelope.get("properties", {}).get("body_encoding") == "base64":
                body = base64.b64decode(body)
            args = loads(body, envelope["content-type"], envelope.get("content-encoding", "utf-8"), accept={"application/json"})[0]
    except Exception:  # not a message of ours (someone else wrote to the queue's list): not a job
        return None
    return str(args[0]) if args else None
