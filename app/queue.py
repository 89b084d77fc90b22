"""The API's side of the job queue: send a job id, count the workers listening."""

from __future__ import annotations

import redis

from .settings import Settings


class JobQueue:
    def __init__(self, settings: Settings):
        from worker.celery_app import make_celery

        self.settings = settings
        self.celery = make_celery(settings)

    def send(self, job_id: str, base_model: str | None = None) -> None:
        from worker.celery_app import TASK_NAME

        self.celery.send_task(TASK_NAME, args=[job_id], queue=self.settings.queue_for(base_model))

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
