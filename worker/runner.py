"""One job, start to finish, inside a worker's child process (no Celery here: testable alone).

claim → heartbeat thread → extension.pipeline.run(spec, callbacks) → archive → finish.
The claim is a conditional update, so a duplicate or redelivered message never runs a job that
a live worker holds; the heartbeat keeps the lease fresh and reads the cancel flag.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.db import jobs as job_state
from app.db.engine import init_db, make_engine, make_sessionmaker
from app.db.jobs import Claim
from app.db.models import Job, StoredFile, utcnow
from app.settings import Settings
from app.storage import job_archive, job_artifacts_dir, job_work_dir, model_dir, remove_tree
from extension.errors import InvalidOptionError, JobCancelled, TideError
from extension.plan.options import OPTIONS, option_error_for
from extension.plan.spec import Callbacks, ExtendSpec

log = logging.getLogger("tide.worker")

# Pipeline inputs -> the request field a client wrote (options are named by extension.plan.options).
_INPUT_PARAMS = {"corpus": "corpus_file_id", "corpus_path": "corpus_file_id", "out": None}
_PROGRESS_WRITE_S = 0.5  # job row: at most twice a second
_PROGRESS_EVENT_S = 5.0  # progress events (loss history): at most every 5 s

_engines: dict[tuple[int, str], sessionmaker[Session]] = {}


def sessions_for(settings: Settings) -> sessionmaker[Session]:
    """One engine per process and URL: a forked child must never reuse its parent's connections."""
    key = (os.getpid(), settings.resolved_database_url)
    if key not in _engines:
        engine = make_engine(settings.resolved_database_url)
        init_db(engine)
        _engines[key] = make_sessionmaker(engine)
    return _engines[key]


def jsonable(value: Any) -> Any:
    """Payloads from the pipeline may hold numpy / torch scalars or paths."""
    return json.loads(json.dumps(value, default=_fallback))


def _fallback(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


class Heartbeat(threading.Thread):
    """Renews the lease every lease/3 s and reads the cancel flag every cancel_poll_s."""

    def __init__(self, sessions: sessionmaker[Session], claim: Claim, settings: Settings):
        super().__init__(name=f"heartbeat-{claim.job_id}", daemon=True)
        self.sessions, self.claim, self.settings = sessions, claim, settings
        self.cancel_requested = threading.Event()
        self.lost = threading.Event()
        self._stop_event = threading.Event()

    def run(self) -> None:
        renew_every = self.settings.lease_s / 3
        next_renew = time.monotonic() + renew_every
        while not self._stop_event.wait(min(self.settings.cancel_poll_s, renew_every)):
            try:
                if time.monotonic() >= next_renew:
                    ours, cancel = job_state.heartbeat(self.sessions, self.claim, self.settings.lease_s)
                    next_renew = time.monotonic() + renew_every
                else:
                    ours, cancel = job_state.read_cancel(self.sessions, self.claim)
            except Exception as exc:  # a database hiccup: keep trying until the lease runs out
                log.warning("heartbeat of %s failed: %s", self.claim.job_id, exc)
                continue
            if not ours:
                log.warning("job %s: lease lost (another worker took it over); stopping", self.claim.job_id)
                self.lost.set()
            if cancel:
                self.cancel_requested.set()

    def should_stop(self) -> bool:
        return self.cancel_requested.is_set() or self.lost.is_set()

    def stop(self) -> None:
        self._stop_event.set()


class JobCallbacks:
    """pipeline callbacks -> database rows (throttled so a fast loop cannot flood the database)."""

    def __init__(self, sessions: sessionmaker[Session], claim: Claim, heartbeat: Heartbeat):
        self.sessions, self.claim, self.heartbeat = sessions, claim, heartbeat
        self._last_write = 0.0
        self._last_event = 0.0

    def on_stage(self, name: str) -> None:
        log.info("job %s: stage %s", self.claim.job_id, name)
        job_state.update_owned(self.sessions, self.claim, [("stage", {"stage": name})], stage=name)

    def on_progress(self, step: int, total: int, metrics: dict) -> None:
        now = time.monotonic()
        last = step >= total
        if not last and now - self._last_write < _PROGRESS_WRITE_S:
            return
        self._last_write = now
        events = []
        if last or now - self._last_event >= _PROGRESS_EVENT_S:
            self._last_event = now
            events.append(("progress", jsonable({"step": step, "total": total, **metrics})))
        job_state.update_owned(self.sessions, self.claim, events, progress_step=step, progress_total=total)

    def on_event(self, kind: str, payload: dict) -> None:
        job_state.update_owned(self.sessions, self.claim, [(kind[:32], jsonable(payload))])

    def on_warning(self, message: str) -> None:
        log.warning("job %s: %s", self.claim.job_id, message)
        job_state.update_owned(self.sessions, self.claim, [("warning", {"message": str(message)})])

    def as_callbacks(self, work_dir: Path) -> Callbacks:
        return Callbacks(
            on_stage=self.on_stage, on_progress=self.on_progress, on_event=self.on_event,
            on_warning=self.on_warning, should_cancel=self.heartbeat.should_stop, work_dir=work_dir,
        )


def build_spec(job: Job, corpus: StoredFile | None, settings: Settings) -> ExtendSpec:
    request = job.request
    return ExtendSpec(
        base_model=request["base_model"],
        out_dir=model_dir(settings, job.id),
        terms=request.get("terms"),
        examples=request.get("examples"),
        corpus_path=Path(corpus.path) if corpus is not None else None,
        corpus_name=corpus.filename if corpus is not None else None,  # the name its owner gave it
        **request_options(request),
        max_term_chars=settings.max_term_chars,
        device=settings.device,
        device_map=settings.device_map,
        precision=settings.precision,
        allow_local_paths=False,
        force=True,  # the folder is this job's own; a takeover republishes over a half-finished attempt
    )


def request_options(request: dict) -> dict:
    """The options of a stored request as ExtendSpec keyword arguments (absent ones: defaults)."""
    values = {}
    for option in OPTIONS:
        if option.api_group is not None:
            group = request if option.api_group == "root" else request.get(option.api_group, {})
            values[option.name] = group.get(option.api_name or option.name, option.unset_default)
    return values


def _api_error(exc: TideError) -> tuple[str, str, str | None]:
    """(code, message, param) of a pipeline error, naming the request field the client wrote."""
    if isinstance(exc, InvalidOptionError):
        return (exc.code, *option_error_for(exc, style="api"))
    return exc.code, exc.message, _INPUT_PARAMS.get(exc.param, exc.param) if exc.param else exc.param


def _is_out_of_memory(exc: BaseException) -> bool:
    return type(exc).__name__ in ("OutOfMemoryError", "MemoryError")


def execute(job_id: str, settings: Settings, *, worker: str | None = None, time_limit_error: type[BaseException] | None = None) -> str:
    """Run the job if this worker may. Returns what happened, for logs and tests."""
    sessions = sessions_for(settings)
    worker = worker or f"{socket.gethostname()}:{os.getpid()}"
    claim, reason = job_state.claim(sessions, job_id, worker=worker, lease_s=settings.lease_s, max_attempts=settings.max_attempts)
    if claim is None:
        log.info("job %s not run: %s", job_id, reason)
        return f"skipped: {reason}"
    log.info("job %s: attempt %d on %s", job_id, claim.attempt, worker)
    heartbeat = Heartbeat(sessions, claim, settings)
    heartbeat.start()
    work_dir = job_work_dir(settings, job_id)
    outcome = "failed"
    try:
        outcome = _run_claimed(sessions, claim, settings, heartbeat, work_dir, time_limit_error)
        return outcome
    finally:
        heartbeat.stop()
        heartbeat.join(timeout=5)
        if outcome in ("succeeded", "failed", "cancelled"):
            remove_tree(work_dir)


def _run_claimed(sessions, claim: Claim, settings: Settings, heartbeat: Heartbeat, work_dir: Path, time_limit_error) -> str:
    from extension import pipeline

    callbacks = JobCallbacks(sessions, claim, heartbeat)
    try:
        with sessions() as db:
            job = db.scalar(select(Job).where(Job.id == claim.job_id))
            corpus = db.get(StoredFile, job.corpus_file_id) if job.corpus_file_id else None
            if job.corpus_file_id and corpus is None:
                raise TideError("the job's corpus upload has expired; upload it again and resubmit", param="corpus_file_id", code="invalid_corpus")
        spec = build_spec(job, corpus, settings)
        work_dir.mkdir(parents=True, exist_ok=True)
        if claim.attempt > 1:
            callbacks.on_warning(f"resuming after the previous worker stopped (attempt {claim.attempt} of {settings.max_attempts})")
        result = pipeline.run(spec, callbacks.as_callbacks(work_dir), settings.model_sources())
        if heartbeat.lost.is_set():
            return "lost"
        # The archive is streamed from the model folder on download; only its size and sha256 are kept.
        archive = job_archive(settings, claim.job_id, job.created_at)
        size, digest = archive.size, archive.sha256()
        summary = {
            "mined_terms": jsonable(result.mined_terms) if result.mined_terms is not None else None,
            "counts": jsonable(result.extension.get("counts", {})),
            "seconds": jsonable(result.seconds),
        }
        trained_steps = result.metrics["training"]["steps"]  # the device's default when the request left it unset
        finished = job_state.finish_owned(
            sessions, claim, "succeeded",
            expires_at=utcnow() + timedelta(hours=settings.artifact_ttl_hours),
            metrics=jsonable(result.metrics), manifest=jsonable(result.manifest), result=summary,
            archive_bytes=size, archive_sha256=digest, progress_step=trained_steps, progress_total=trained_steps,
        )
        return "succeeded" if finished else "lost"
    except JobCancelled:
        if heartbeat.lost.is_set():
            return "lost"
        remove_tree(job_artifacts_dir(settings, claim.job_id))
        job_state.finish_owned(sessions, claim, "cancelled")
        return "cancelled"
    except TideError as exc:
        if disk_full(exc, settings, claim.job_id, by_free_space=False):  # bad input on a full disk is still bad input
            _fail_disk_full(sessions, claim, settings, exc)
            return "failed"
        log.info("job %s failed: %s: %s", claim.job_id, exc.code, exc.message)
        _fail(sessions, claim, settings, _api_error(exc))
        return "failed"
    except BaseException as exc:
        if time_limit_error is not None and isinstance(exc, time_limit_error):
            _fail(sessions, claim, settings, (
                "time_limit_exceeded",
                f"the job ran longer than this server's limit of {settings.job_time_limit_s} s; ask for fewer training steps",
                "training.steps",
            ))
            return "failed"
        if _is_out_of_memory(exc):
            log.exception("job %s ran out of memory", claim.job_id)
            _fail(sessions, claim, settings, (
                "out_of_memory",
                "the job ran out of memory; lower training.batch_size or training.seq_len and submit it again",
                "training.batch_size",
            ))
            return "failed"
        if not isinstance(exc, Exception):
            raise  # KeyboardInterrupt / SystemExit: the worker is going down, the lease will expire
        if disk_full(exc, settings, claim.job_id):
            _fail_disk_full(sessions, claim, settings, exc)
            return "failed"
        log.exception("job %s failed unexpectedly", claim.job_id)
        _fail(sessions, claim, settings, (
            "internal_error",
            f"the job failed unexpectedly ({type(exc).__name__}); the worker log has the details under job id {claim.job_id}",
            None,
        ))
        return "failed"


_DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_DISK_FULL_TEXTS = (os.strerror(errno.ENOSPC), os.strerror(errno.EDQUOT))  # safetensors only says it in words
_NEARLY_FULL_BYTES = 1024 * 1024  # or 1% of a smaller disk


def disk_full(exc: BaseException, settings: Settings, job_id: str, *, by_free_space: bool = True) -> bool:
    """Did this job fail because its disk filled up? The OS says ENOSPC; libraries wrap it (safetensors
    in words, torch.save as "unexpected pos"), so a disk left all but full when the job failed counts
    too (checked before the job's partial files are removed)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in _DISK_FULL_ERRNOS:
            return True
        if any(text in str(seen) for text in _DISK_FULL_TEXTS):
            return True
        seen = seen.__cause__ or seen.__context__
    if not by_free_space:
        return False
    for folder in (job_artifacts_dir(settings, job_id), job_work_dir(settings, job_id)):
        try:
            usage = shutil.disk_usage(folder)
        except FileNotFoundError:
            continue
        if usage.free < min(_NEARLY_FULL_BYTES, usage.total // 100):
            return True
    return False


def _fail_disk_full(sessions, claim: Claim, settings: Settings, exc: BaseException) -> None:
    log.error(
        "job %s: the disk filled up (%s: %s); free space under %s and %s", claim.job_id, type(exc).__name__, exc,
        settings.resolved_artifacts_dir, settings.resolved_work_dir,
    )
    remove_tree(job_work_dir(settings, claim.job_id))
    _fail(sessions, claim, settings, (
        "disk_full",
        "the server ran out of disk space while writing this job's files, so the job stopped and nothing of it was "
        "kept; submit it again later (the worker log tells the operator where space ran out)",
        None,
    ))


def _fail(sessions, claim: Claim, settings: Settings, error: tuple[str, str, str | None]) -> None:
    remove_tree(job_artifacts_dir(settings, claim.job_id))
    job_state.finish_owned(sessions, claim, "failed", error=error)
