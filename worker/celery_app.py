"""The Celery app: Redis broker, one `gpu` queue, settings for hour-long jobs.

Celery carries only a job id; the database says what the job is and whether it may run.
Importing this module is cheap (no torch): the API imports it to send jobs and ping workers.
"""

from __future__ import annotations

from celery import Celery

from app.settings import Settings, get_settings

TASK_NAME = "tide.run_job"


def make_celery(settings: Settings) -> Celery:
    celery = Celery("tide", broker=settings.redis_url, include=["worker.tasks"])
    celery.conf.update(
        # A message is acknowledged only when its job is done, and handed back when the process
        # running it dies, so a crash never loses a job.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        # The multiplier alone still lets a busy worker reserve one more job: after Redis
        # reconnects, the running job's message belongs to the dead channel, so the new channel's
        # prefetch window of 1 is empty and takes the next job while another worker idles. With
        # this (Celery >= 5.6, Redis broker) the worker fetches only when a process is free.
        worker_disable_prefetch=True,
        task_default_queue=settings.queue,
        task_routes={TASK_NAME: {"queue": settings.queue}},
        task_ignore_result=True,  # the database is the result store
        # One job per GPU at a time, each in a fresh child: CUDA state and leaked memory die with
        # the child, and the parent (which never imports torch) keeps answering pings.
        worker_pool="prefork",
        worker_concurrency=1,
        worker_max_tasks_per_child=1,
        # Redis re-delivers an unacknowledged message after this; it must outlast the longest job.
        broker_transport_options={"visibility_timeout": settings.visibility_timeout_s},
        task_soft_time_limit=settings.job_time_limit_s,
        task_time_limit=settings.job_time_limit_s + 120,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
        task_serializer="json",
        accept_content=["json"],
    )
    return celery


celery_app = make_celery(get_settings())
