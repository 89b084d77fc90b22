"""The one Celery task. torch and the pipeline are imported inside the job's child process only;
the light part (database, claim) is imported here, in the parent, so forked children start
claiming at once instead of spending a second importing SQLAlchemy."""

from __future__ import annotations

import logging
import os

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_process_init

from app.settings import get_settings

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


@celery_app.task(name=TASK_NAME, bind=True)
def run_job(self, job_id: str) -> str:
    settings = get_settings()
    if settings.worker_torch_threads:
        import torch

        torch.set_num_threads(settings.worker_torch_threads)
    outcome = execute(job_id, settings, worker=f"{self.request.hostname}:{os.getpid()}", time_limit_error=SoftTimeLimitExceeded)
    log.info("job %s: %s", job_id, outcome)
    return outcome
