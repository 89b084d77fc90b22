"""Issue 38, item 5: cancelled and deleted queued jobs left their broker message behind, and the
worker started a fresh child process for each dead message (1.4-5 s each on a loaded machine), so
a key looping submit-and-cancel delayed every other key's jobs. Now a cancel or a delete removes
the job's waiting message from Redis, a message whose job row says it is finished (or gone) is
dropped in the worker's parent without a child process, and POST /extend counts each key's
submits per minute (TIDE_MAX_SUBMITS_PER_MINUTE_PER_KEY, then 429 with Retry-After)."""

from __future__ import annotations

import re
import time

import pytest

from .conftest import QUICK_EVAL, SHORT, TINY_MODEL, open_service

BODY = {"base_model": TINY_MODEL, "terms": ["hypertext"], "training": {"steps": 1}}


@pytest.fixture()
def service(fault_settings):
    """The faults service with room for more than the default 4 queued jobs of one key."""
    with open_service(fault_settings.model_copy(update={"max_active_jobs_per_key": 100})) as running:
        yield running


def test_a_cancel_or_delete_removes_the_jobs_waiting_message(service, redis_server):
    jobs = [service.submit(BODY)["id"] for _ in range(6)]  # no worker: the messages wait
    assert service.queue_length(redis_server) == 6
    for job_id in jobs[:4]:
        service.cancel(job_id)
    for job_id in jobs[:2]:
        assert service.client.delete(f"/jobs/{job_id}", headers=service.auth).status_code == 204
    assert service.queue_length(redis_server) == 2  # only the two jobs still queued
    assert service.app.state.queue.waiting_job_ids(service.settings.queue) == set(jobs[4:])


def test_dead_messages_start_no_process_and_hold_up_no_live_job(service, redis_server):
    dead = [service.submit(BODY)["id"] for _ in range(10)]
    for job_id in dead:
        service.cancel(job_id)
    for job_id in dead[:5]:
        assert service.client.delete(f"/jobs/{job_id}", headers=service.auth).status_code == 204
    # Messages a cancel could not take back (a Redis that was away, a message already moved by a
    # worker that then died): sent again here, so that they wait in the queue as such leftovers do.
    for job_id in dead:
        service.app.state.queue.send(job_id, TINY_MODEL)
    live = service.submit({"base_model": TINY_MODEL, "terms": ["multiprogramming"], "training": SHORT, "evaluation": QUICK_EVAL})
    assert service.queue_length(redis_server) >= 11  # (before the fix: 21, the cancels took none back)

    worker = service.start_worker()
    done = service.wait_for_status(live["id"], {"succeeded", "failed"}, 240)
    assert done["status"] == "succeeded", done
    log = worker.log_path.read_text(errors="replace")
    children = set(re.findall(r"ForkPoolWorker-\d+", log))
    # one child for the live job; before the fix one more for each of the 10 dead messages
    assert len(children) <= 1, (sorted(children), worker.log_tail())
    for job_id in dead:
        assert re.search(rf"job {job_id} is (already cancelled|deleted): its message is dropped", log), worker.log_tail()
    time.sleep(1)
    assert service.queue_length(redis_server) == 0  # every message acknowledged, none left


def test_submits_beyond_the_per_minute_limit_get_429_with_retry_after(fault_settings, redis_server):
    settings = fault_settings.model_copy(update={"max_submits_per_minute_per_key": 3})
    with open_service(settings) as service:
        for _ in range(4):  # invalid requests are refused as such and not counted: a 429 never stands in for a 422
            invalid = service.client.post("/extend", json={**BODY, "terms": ["bad\u00a0term"]}, headers=service.auth)
            assert invalid.status_code == 422, invalid.text
        first = service.client.post("/extend", json=BODY, headers={**service.auth, "Idempotency-Key": "one"})
        assert first.status_code == 202, first.text
        for _ in range(2):
            service.submit(BODY)
        refused = service.client.post("/extend", json=BODY, headers=service.auth)
        assert refused.status_code == 429, refused.text
        error = refused.json()["error"]
        assert error["code"] == "too_many_submits", error
        wait = int(refused.headers["Retry-After"])
        assert 1 <= wait <= 60, refused.headers
        assert f"retry in {wait} s" in error["message"] and "3" in error["message"], error
        # an idempotent retry of a job already accepted is not a new submit
        replay = service.client.post("/extend", json=BODY, headers={**service.auth, "Idempotency-Key": "one"})
        assert replay.status_code == 202 and replay.json()["id"] == first.json()["id"], replay.text
        # another key has its own count
        from app.db.keys import create_key

        with service.app.state.sessions() as session:
            other = {"Authorization": f"Bearer {create_key(session, 'other')[1]}"}
        assert service.client.post("/extend", json=BODY, headers=other).status_code == 202
