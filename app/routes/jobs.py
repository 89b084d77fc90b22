"""POST /extend and the job resource: list, read, events, cancel, delete."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from sqlalchemy import select

from ..db.jobs import add_event, current, delete_finished, request_cancel
from ..db.models import TERMINAL, Event, Job, utcnow
from ..deps import KeyDep, SessionsDep, SettingsDep, get_base_tokenizers, get_queue
from ..errors import ApiError, quoted
from ..schemas import ErrorResponse, EventList, ExtendRequest, JobList, JobStatus
from ..schemas import Event as EventOut
from ..schemas import Job as JobOut
from ..storage import job_artifacts_dir, job_work_dir, remove_tree
from ..submission import submit
from ..views import job_view
from . import AUTH_ERRORS, CONFLICT, INVALID, NOT_FOUND, STORAGE_FULL, TOO_MANY_JOBS

router = APIRouter(tags=["jobs"], responses={**AUTH_ERRORS, **INVALID})
log = logging.getLogger("tide.api")
_MAX_CURSOR = 2**63 - 1  # job sequence numbers are 64-bit integers in every database


def no_job(job_id: str) -> ApiError:
    return ApiError(404, "not_found", f"no job {quoted(job_id)} for this API key; list yours with GET /jobs", "job_id")


def owned_job(db, key, job_id: str) -> Job:
    job = db.scalar(select(Job).where(Job.id == job_id))
    if job is None or job.owner_id != key.id:
        # Another key's job is indistinguishable from no job at all.
        raise no_job(job_id)
    return job


def drop_message(queue, job_id: str, base_model: str | None) -> None:
    """A finished job's message still waiting in the queue is taken out (issue 38): best effort,
    as a worker's parent drops any it meets anyway."""
    try:
        queue.drop(job_id, base_model)
    except Exception as exc:
        log.warning("could not take the message of %s out of its queue: %s", job_id, exc)


def enqueue(db, queue, job: Job) -> None:
    try:
        queue.send(job.id, job.base_model)
    except Exception as exc:
        # The job is safely stored; the sweeper re-sends jobs that never reached the queue.
        log.warning("could not queue %s: %s", job.id, exc)
        add_event(db, job.id, "warning", {"message": "the job queue is not answering; the job will be sent when it is back"})
        db.commit()
        return
    job.enqueued_at = utcnow()
    db.commit()


@router.post(
    "/extend",
    status_code=202,
    response_model=JobOut,
    summary="Start a job: extend a model's vocabulary with new terms",
    responses={
        202: {"description": "Accepted; poll the Location", "headers": {"Location": {"schema": {"type": "string"}, "description": "The job's URL"}}},
        **CONFLICT, **STORAGE_FULL,
        429: {**TOO_MANY_JOBS[429], "description": "This key has TIDE_MAX_ACTIVE_JOBS_PER_KEY jobs queued or running "
              "(too_many_active_jobs), or sent TIDE_MAX_SUBMITS_PER_MINUTE_PER_KEY submits in the last minute "
              "(too_many_submits, with Retry-After)"},
        408: {"model": ErrorResponse, "description": "The body stopped arriving for TIDE_REQUEST_BODY_TIMEOUT_S"},
        413: {"model": ErrorResponse, "description": "The body is larger than TIDE_MAX_REQUEST_BODY_BYTES"},
    },
)
def extend(
    body: ExtendRequest,
    request: Request,
    response: Response,
    sessions: SessionsDep,
    key: KeyDep,
    settings: SettingsDep,
    queue=Depends(get_queue),
    tokenizers=Depends(get_base_tokenizers),
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", description="Retrying with the same key returns the same job")] = None,
) -> JobOut:
    with sessions() as db:
        # counted once the request is valid and new: a replay is not a submit, and a 429 never stands in for a 422
        job, created = submit(db, key, body, settings, idempotency_key, tokenizers, count_submit=request.app.state.submit_rate.check)
        if created:
            enqueue(db, queue, job)
        else:
            response.headers["Idempotent-Replayed"] = "true"
        response.headers["Location"] = f"/jobs/{job.id}"
        return job_view(job)


@router.get("/jobs", response_model=JobList, summary="Your jobs, newest first")
def list_jobs(
    sessions: SessionsDep,
    key: KeyDep,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: Annotated[str | None, Query(max_length=20, description="next_cursor from the previous page")] = None,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this status")] = None,
) -> JobList:
    query = select(Job).where(Job.owner_id == key.id)
    if cursor is not None:
        # isdigit() alone lets through digits the database cannot hold (20 nines overflow a
        # 64-bit integer) and non-ASCII digits int() refuses.
        if not (cursor.isascii() and cursor.isdigit()) or int(cursor) > _MAX_CURSOR:
            raise ApiError(
                422, "invalid_request",
                f"cursor {cursor[:20]!r} is not a page cursor; pass the next_cursor value of the previous page, or leave cursor out for the first page",
                "cursor",
            )
        query = query.where(Job.seq < int(cursor))
    if status is not None:
        query = query.where(Job.status == status)
    with sessions() as db:
        jobs = list(db.scalars(query.order_by(Job.seq.desc()).limit(limit + 1)))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return JobList(data=[job_view(j) for j in jobs], next_cursor=str(jobs[-1].seq) if more else None)


@router.get("/jobs/{job_id}", response_model=JobOut, summary="A job's status, stage, progress, metrics and error", responses=NOT_FOUND)
def get_job(job_id: str, sessions: SessionsDep, key: KeyDep) -> JobOut:
    with sessions() as db:
        return job_view(owned_job(db, key, job_id))


@router.get("/jobs/{job_id}/events", response_model=EventList, summary="Stage changes, progress, metrics and warnings", responses=NOT_FOUND)
def job_events(
    job_id: str,
    sessions: SessionsDep,
    key: KeyDep,
    after: Annotated[int, Query(ge=0, le=2**62, description="Only events with a larger id")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> EventList:
    with sessions() as db:
        owned_job(db, key, job_id)
        rows = list(db.scalars(select(Event).where(Event.job_id == job_id, Event.id > after).order_by(Event.id).limit(limit)))
    data = [EventOut(id=e.id, kind=e.kind, payload=e.payload, created_at=e.created_at) for e in rows]
    return EventList(data=data, next_after=data[-1].id if data else after)


@router.post("/jobs/{job_id}/cancel", response_model=JobOut, summary="Cancel a queued or running job", responses={**NOT_FOUND, **CONFLICT})
def cancel_job(job_id: str, sessions: SessionsDep, key: KeyDep, queue=Depends(get_queue)) -> JobOut:
    with sessions() as db:
        owned_job(db, key, job_id)
        holds, job = request_cancel(db, job_id)
        if job is None:  # deleted since it was read
            raise no_job(job_id)
        if not holds:
            raise ApiError(409, "job_finished", f"job {job_id} already {job.status}; there is nothing to cancel", "job_id")
    if job.status == "cancelled":  # it was queued: its message would only cost a worker a process
        drop_message(queue, job_id, job.base_model)
    return job_view(job)


@router.delete("/jobs/{job_id}", status_code=204, summary="Delete a finished job and its artifacts", responses={**NOT_FOUND, **CONFLICT})
def delete_job(job_id: str, sessions: SessionsDep, key: KeyDep, settings: SettingsDep, queue=Depends(get_queue)) -> Response:
    with sessions() as db:
        base_model = owned_job(db, key, job_id).base_model
        while True:
            deleted, inline_corpus = delete_finished(db, job_id)
            if deleted:
                break
            job = current(db, job_id)
            if job is None:  # a concurrent DELETE won
                raise no_job(job_id)
            if job.status not in TERMINAL:
                raise ApiError(409, "job_active", f"job {job_id} is {job.status}; cancel it first (POST /jobs/{job_id}/cancel)", "job_id")
            # it finished between the DELETE and the look: once finished it stays so, try again
    # Files go once the rows are gone: a download that finds them missing finds the job gone too,
    # and one already sending holds its files open until it has sent every byte.
    drop_message(queue, job_id, base_model)  # one a cancel could not take back
    remove_tree(job_artifacts_dir(settings, job_id))
    remove_tree(job_work_dir(settings, job_id))
    if inline_corpus is not None:
        Path(inline_corpus).unlink(missing_ok=True)
    return Response(status_code=204)
