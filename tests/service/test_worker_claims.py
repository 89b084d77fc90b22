"""The claim / lease / takeover rules on a real SQLite database: a job never runs twice at once,
a dead worker's job is taken over, and after the last attempt it fails instead of hanging."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from app.db import jobs as job_state
from app.db.engine import init_db, make_engine, make_sessionmaker
from app.db.keys import create_key
from app.db.models import Job, utcnow


@pytest.fixture()
def sessions(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'jobs.db'}")
    init_db(engine)
    yield make_sessionmaker(engine)
    engine.dispose()


@pytest.fixture()
def job_id(sessions) -> str:
    with sessions() as db:
        key, _ = create_key(db, "k")
        job = Job(id=job_state.new_job_id(), owner_id=key.id, request_hash="h", request={}, base_model="m")
        db.add(job)
        db.commit()
        return job.id


def _expire_lease(sessions, job_id: str) -> None:
    with sessions() as db:
        db.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        db.commit()


def _job(sessions, job_id: str) -> Job:
    with sessions() as db:
        return db.query(Job).filter_by(id=job_id).one()


def cancel(sessions, job_id: str) -> bool:
    with sessions() as db:
        return job_state.request_cancel(db, job_id)[0]


def claim(sessions, job_id, worker="w1", max_attempts=2):
    return job_state.claim(sessions, job_id, worker=worker, lease_s=30, max_attempts=max_attempts)


def test_second_delivery_while_the_first_holds_the_lease_is_skipped(sessions, job_id):
    first, reason = claim(sessions, job_id)
    assert first is not None and first.attempt == 1 and reason == "claimed"
    second, reason = claim(sessions, job_id, worker="w2")
    assert second is None and "live worker" in reason
    assert _job(sessions, job_id).worker == "w1"


def test_expired_lease_is_taken_over_and_the_old_holder_loses_it(sessions, job_id):
    first, _ = claim(sessions, job_id)
    _expire_lease(sessions, job_id)
    second, _ = claim(sessions, job_id, worker="w2")
    assert second is not None and second.attempt == 2
    assert job_state.heartbeat(sessions, first, 30) == (False, False)
    assert job_state.update_owned(sessions, first, stage="train") is False
    assert job_state.finish_owned(sessions, first, "succeeded") is False
    assert job_state.heartbeat(sessions, second, 30) == (True, False)
    assert job_state.finish_owned(sessions, second, "succeeded") is True
    assert _job(sessions, job_id).status == "succeeded"
    assert claim(sessions, job_id, worker="w3") == (None, "already succeeded")


def test_after_the_last_attempt_the_job_fails_instead_of_hanging(sessions, job_id):
    claim(sessions, job_id)
    _expire_lease(sessions, job_id)
    claim(sessions, job_id, worker="w2")
    _expire_lease(sessions, job_id)
    again, reason = claim(sessions, job_id, worker="w3")
    assert again is None and reason == "max attempts exceeded"
    job = _job(sessions, job_id)
    assert job.status == "failed" and job.error_code == "max_attempts_exceeded" and "2 attempts" in job.error_message


def test_cancel_flag_reaches_the_heartbeat_and_a_dead_cancelling_job_ends_cancelled(sessions, job_id):
    held, _ = claim(sessions, job_id)
    assert cancel(sessions, job_id) is True
    assert job_state.read_cancel(sessions, held) == (True, True)
    assert job_state.heartbeat(sessions, held, 30) == (True, True)
    _expire_lease(sessions, job_id)
    assert claim(sessions, job_id, worker="w2")[0] is None
    assert _job(sessions, job_id).status == "cancelled"


def test_cancel_of_a_queued_job_means_its_message_never_runs(sessions, job_id):
    assert cancel(sessions, job_id) is True
    assert _job(sessions, job_id).status == "cancelled"
    assert claim(sessions, job_id) == (None, "already cancelled")
    assert cancel(sessions, job_id) is True  # idempotent


def test_finished_jobs_cannot_be_cancelled(sessions, job_id):
    held, _ = claim(sessions, job_id)
    job_state.finish_owned(sessions, held, "failed", error=("x", "y", None))
    assert cancel(sessions, job_id) is False
