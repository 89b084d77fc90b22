"""The one Celery task. torch and the pipeline are imported inside the job's child process only;
the light part (database, claim) is imported here, in the parent, so forked children start
claiming at once instead of spending a second importing SQLAlchemy."""

from __future__ import annotations

import logging
import os

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init
from celery.worker.request import Request
from celery.worker.state import task_ready
from sqlalchemy import create_engine, event, select
from sqlalchemy.pool import NullPool

from app.db.engine import _tune_sqlite
from app.db.models import TERMINAL, Job
from app.settings import Settings, get_settings

from .celery_app import TASK_NAME, celery_app
from .runner import execute

log = logging.getLogger("tide.worker")


@worker_process_init.connect
def _prepare_child(**_kwargs) -> None:
    # Each job runs in a fresh child (max_tasks_per_child=1). Lower its priority so an API on the
    # same host keeps answering polls while it trains.
    settings = get_settings()
    if settings.worker_nice:
        os.nice(settings.worker_nice)


_status_engines: dict[str, object] = {}


def _status_engine(settings: Settings):
    """The parent's own engine, without a pool: no connection stays open to be inherited by the
    children it forks."""
    url = settings.resolved_database_url
    if url not in _status_engines:
        if url.startswith("sqlite"):
            engine = create_engine(url, poolclass=NullPool, connect_args={"timeout": 10})
            event.listen(engine, "connect", _tune_sqlite)
        else:
            engine = create_engine(url, poolclass=NullPool)
        _status_engines[url] = engine
    return _status_engines[url]


def dead_message_reason(job_id, settings: Settings) -> str | None:
    """Why the message of `job_id` has nothing left to run ("deleted", "already cancelled"...),
    from the job row; None when it may (or when the database cannot say: the child decides)."""
    try:
        with _status_engine(settings).connect() as connection:
            status = connection.execute(select(Job.status).where(Job.id == str(job_id))).scalar()
    except Exception as exc:
        log.warning("could not read the status of job %s before starting it: %s", job_id, exc)
        return None
    if status is None:
        return "deleted"
    return f"already {status}" if status in TERMINAL else None


class JobRequest(Request):
    """A message in the worker's parent, before a child process is given it. A cancelled or
    deleted job's message (one its cancel could not take out of Redis) is acknowledged and dropped
    here, as Celery drops a revoked task: with a fresh child per task, each dead message used to
    cost a process start (1.4-5 s on a loaded machine), and a key looping submit-and-cancel
    delayed every other key's jobs (issue 38)."""

    def revoked(self) -> bool:
        if super().revoked():
            return True
        args = self.args or [None]
        reason = dead_message_reason(args[0], get_settings())
        if reason is None:
            return False
        log.info("job %s is %s: its message is dropped without starting a process", args[0], reason)
        task_ready(self)
        self.acknowledge()
        self._already_revoked = True
        return True


@celery_app.task(name=TASK_NAME, bind=True, Request=JobRequest)
def run_job(self, job_id: str) -> str:
    settings = get_settings()
    if settings.worker_torch_threads:
        import torch

        torch.set_num_threads(settings.worker_torch_threads)
    outcome = execute(job_id, settings, worker=f"{self.request.hostname}:{os.getpid()}", time_limit_error=SoftTimeLimitExceeded)
    log.info("job %s: %s", job_id, outcome)
    return outcome
