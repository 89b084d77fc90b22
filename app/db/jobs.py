"""Job state transitions, each one conditional UPDATE so API, worker and sweeper never race.

queued ──claim──> running ──> succeeded | failed | cancelled
 │  ▲                 │  └─cancel─> cancelling ──(worker sees flag)──> cancelled
 │  └──lease expired──┘  (worker_lost: the sweeper queues it again, or fails it after max_attempts)
 └─cancel─> cancelled
A running job holds a lease renewed by its worker's heartbeat. A redelivered message may take
over a job only once that lease has expired, and only `max_attempts` times in all.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, delete, select, update
from sqlalchemy.orm import Session, sessionmaker

from .models import ACTIVE, TERMINAL, Event, Job, StoredFile, utcnow


@dataclass(frozen=True)
class Claim:
    job_id: str
    token: str
    attempt: int


def new_job_id() -> str:
    return "job_" + uuid.uuid4().hex


def add_event(session: Session, job_id: str, kind: str, payload: dict[str, Any]) -> None:
    session.add(Event(job_id=job_id, kind=kind, payload=payload))


def claim(
    sessions: sessionmaker[Session], job_id: str, *, worker: str, lease_s: float, max_attempts: int
) -> tuple[Claim | None, str]:
    """Take the job for this worker. Returns (claim, reason); claim is None when we must not run it."""
    now = utcnow()
    token = uuid.uuid4().hex
    expired = and_(Job.lease_expires_at.is_not(None), Job.lease_expires_at < now)
    values = dict(
        status="running",
        attempt=Job.attempt + 1,
        claim_token=token,
        lease_expires_at=now + timedelta(seconds=lease_s),
        worker=worker,
        started_at=now,
        updated_at=now,
    )
    with sessions() as session:
        before = session.scalar(select(Job).where(Job.id == job_id))
        # The second form takes over a running job whose lease expired, when its message comes
        # back before the sweeper has queued it again; it says so, as the sweeper would.
        for condition, taking_over in ((Job.status == "queued", False), (and_(Job.status == "running", expired), True)):
            result = session.execute(
                update(Job)
                .where(Job.id == job_id, Job.attempt < max_attempts, condition)
                .values(**values)
                .execution_options(synchronize_session=False)
            )
            if result.rowcount == 1:
                if taking_over and before is not None:
                    add_event(session, job_id, "worker_lost", worker_lost_payload(before, max_attempts))
                attempt = session.scalar(select(Job.attempt).where(Job.id == job_id))
                add_event(session, job_id, "status", {"status": "running", "attempt": attempt, "worker": worker})
                session.commit()
                return Claim(job_id, token, int(attempt)), "claimed"
        session.rollback()
        job = session.scalar(select(Job).where(Job.id == job_id))
        if job is None:
            return None, "unknown job"
        if job.status in TERMINAL:
            return None, f"already {job.status}"
        lease_dead = job.lease_expires_at is not None and job.lease_expires_at < now
        if job.status == "cancelling" and lease_dead:
            finish_unowned(session, job_id, "cancelled", None, "cancelling")
            return None, "cancelled while its worker was gone"
        if job.status == "running" and lease_dead and job.attempt >= max_attempts:
            finish_unowned(session, job_id, "failed", max_attempts_error(job.attempt, max_attempts), "running")
            return None, "max attempts exceeded"
        return None, f"held by a live worker ({job.status})"


def max_attempts_error(attempts: int, max_attempts: int) -> tuple[str, str]:
    return (
        "max_attempts_exceeded",
        f"the job's worker stopped {attempts} times (crash, out of memory or host loss) and "
        f"the limit is {max_attempts} attempts; check the worker logs, then submit it again "
        "(with fewer steps or a smaller batch if memory ran out)",
    )


def worker_lost_payload(job: Job, max_attempts: int) -> dict[str, Any]:
    """What a client reads when the worker of a running job vanished: which attempt, where it was."""
    return {
        "attempt": job.attempt,
        "max_attempts": max_attempts,
        "stage": job.stage,
        "step": job.progress_step,
        "total": job.progress_total,
        "lease_expired_at": job.lease_expires_at.isoformat() if job.lease_expires_at else None,
        "message": (
            f"the worker running attempt {job.attempt} of {max_attempts} stopped renewing its lease (it crashed, ran "
            "out of memory or lost its host); the next attempt resumes from the last training checkpoint, so the "
            "progress may step back to it"
        ),
    }


def release_lost_worker(session: Session, job: Job, max_attempts: int) -> str | None:
    """A running job whose lease expired: queue it again (worker_lost), or fail it after the last
    attempt. Conditional on the lease and claim the caller saw, so a worker that renewed in the
    meantime keeps its job. Returns "queued", "failed", or None when nothing changed."""
    now = utcnow()
    seen = and_(
        Job.id == job.id, Job.status == "running", Job.claim_token == job.claim_token, Job.lease_expires_at < now
    )
    if job.attempt >= max_attempts:
        code, message = max_attempts_error(job.attempt, max_attempts)
        values: dict[str, Any] = {
            "status": "failed", "finished_at": now, "updated_at": now, "claim_token": None,
            "error_code": code, "error_message": message,
        }
        payload: dict[str, Any] = {"status": "failed", "error": {"code": code, "message": message}}
        outcome = "failed"
    else:
        # enqueued_at None: until the sweeper has sent it again it counts as never sent
        values = {"status": "queued", "updated_at": now, "claim_token": None, "lease_expires_at": None, "enqueued_at": None}
        payload = {"status": "queued", "attempt": job.attempt}
        outcome = "queued"
    if session.execute(update(Job).where(seen).values(**values).execution_options(synchronize_session=False)).rowcount != 1:
        session.rollback()
        return None
    if outcome == "queued":
        add_event(session, job.id, "worker_lost", worker_lost_payload(job, max_attempts))
    add_event(session, job.id, "status", payload)
    session.commit()
    return outcome


def finish_unowned(session: Session, job_id: str, status: str, error: tuple[str, str] | None, expected: str) -> bool:
    """End a job no worker holds (cancelled while its worker was gone, or never delivered)."""
    now = utcnow()
    values: dict[str, Any] = {"status": status, "finished_at": now, "updated_at": now, "claim_token": None}
    if error:
        values.update(error_code=error[0], error_message=error[1])
    result = session.execute(
        update(Job).where(Job.id == job_id, Job.status == expected).values(**values).execution_options(synchronize_session=False)
    )
    if result.rowcount == 1:
        payload: dict[str, Any] = {"status": status}
        if error:
            payload["error"] = {"code": error[0], "message": error[1]}
        add_event(session, job_id, "status", payload)
    session.commit()
    return result.rowcount == 1


def _owned(job_id: str, token: str):
    return and_(Job.id == job_id, Job.claim_token == token, Job.status.in_(ACTIVE))


def heartbeat(sessions: sessionmaker[Session], claim_: Claim, lease_s: float) -> tuple[bool, bool]:
    """Renew the lease. Returns (still_ours, cancel_requested)."""
    now = utcnow()
    with sessions() as session:
        result = session.execute(
            update(Job)
            .where(_owned(claim_.job_id, claim_.token))
            .values(lease_expires_at=now + timedelta(seconds=lease_s))
            .execution_options(synchronize_session=False)
        )
        status = session.scalar(select(Job.status).where(Job.id == claim_.job_id))
        session.commit()
    return result.rowcount == 1, status == "cancelling"


def read_cancel(sessions: sessionmaker[Session], claim_: Claim) -> tuple[bool, bool]:
    """(still_ours, cancel_requested) without writing."""
    with sessions() as session:
        row = session.execute(select(Job.status, Job.claim_token).where(Job.id == claim_.job_id)).first()
    if row is None:
        return False, True
    return row.claim_token == claim_.token and row.status in ACTIVE, row.status == "cancelling"


def update_owned(sessions: sessionmaker[Session], claim_: Claim, events: list[tuple[str, dict]] = (), **values: Any) -> bool:
    """Write fields of a job we hold (stage, progress, metrics), plus events, in one transaction.

    Progress counts within a stage (training steps, generated contexts, scored chunks): a new
    stage starts at 0 of 0 until it reports, so the last stage's count never shows under its name."""
    with sessions() as session:
        values["updated_at"] = utcnow()
        if "stage" in values:
            values.setdefault("progress_step", 0)
            values.setdefault("progress_total", 0)
        result = session.execute(
            update(Job).where(_owned(claim_.job_id, claim_.token)).values(**values).execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:
            for kind, payload in events:
                add_event(session, claim_.job_id, kind, payload)
            session.commit()
            return True
        session.rollback()
        return False


def finish_owned(
    sessions: sessionmaker[Session],
    claim_: Claim,
    status: str,
    *,
    error: tuple[str, str, str | None] | None = None,
    expires_at: datetime | None = None,
    **values: Any,
) -> bool:
    now = utcnow()
    values.update(status=status, finished_at=now, updated_at=now, claim_token=None, lease_expires_at=None)
    if expires_at is not None:
        values["expires_at"] = expires_at
    payload: dict[str, Any] = {"status": status}
    if error:
        values.update(error_code=error[0], error_message=error[1], error_param=error[2])
        payload["error"] = {"code": error[0], "message": error[1], "param": error[2]}
    return update_owned(sessions, claim_, [("status", payload)], **values)


def current(session: Session, job_id: str) -> Job | None:
    """The job's row as the database has it now (not as this session last loaded it)."""
    return session.scalar(select(Job).where(Job.id == job_id).execution_options(populate_existing=True))


def request_cancel(session: Session, job_id: str) -> tuple[bool, Job | None]:
    """Queued → cancelled at once; running → cancelling (the worker stops at its next check).

    Each change is one conditional UPDATE, and the row is read back in the same transaction, so
    the answer is the state that change made, whatever a concurrent DELETE does next. Returns
    (holds, job): job is None when there is no such job (deleted meanwhile); holds is True when
    the job is now cancelled or cancelling, False when it had already finished."""
    now = utcnow()
    for before, after, extra in (("queued", "cancelled", {"finished_at": now}), ("running", "cancelling", {})):
        changed = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == before)
            .values(status=after, updated_at=now, **extra)
            .execution_options(synchronize_session=False)
        ).rowcount
        if changed:
            add_event(session, job_id, "status", {"status": after})
            job = current(session, job_id)
            session.commit()
            return True, job
    session.rollback()
    job = current(session, job_id)
    return job is not None and job.status in ("cancelling", "cancelled"), job


def delete_finished(session: Session, job_id: str) -> tuple[bool, str | None]:
    """Delete a finished job's rows (events, job, its inline corpus) in one transaction that a
    conditional DELETE decides: of concurrent deletes of one job exactly one gets True, and an
    active job is never deleted. Returns (deleted, path of the inline corpus file to remove).
    The caller removes the job's files after this, so a request that finds files missing also
    finds the job gone."""
    corpus_file_id = session.scalar(select(Job.corpus_file_id).where(Job.id == job_id))
    session.execute(delete(Event).where(Event.job_id == job_id).execution_options(synchronize_session=False))
    deleted = session.execute(
        delete(Job).where(Job.id == job_id, Job.status.in_(TERMINAL)).execution_options(synchronize_session=False)
    ).rowcount
    if not deleted:
        session.rollback()  # the events too: the job is active, or another request deleted it
        return False, None
    inline_path = None
    inline = session.get(StoredFile, corpus_file_id) if corpus_file_id else None
    if inline is not None and inline.source == "inline":
        inline_path = inline.path
        session.delete(inline)
    session.commit()
    return True, inline_path
