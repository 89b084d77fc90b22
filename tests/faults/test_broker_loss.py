"""Issue 13 item 1: a job reaches a worker or fails with a reason, whatever happens to the
broker's memory. The broker here is a real redis-server without persistence that the tests crash
(SIGKILL) and start again empty; the sweeper is the API's own, running every 0.5 s."""

from __future__ import annotations

import time

from .conftest import LONG, QUICK_EVAL, SHORT, TINY_MODEL, open_service


def _kinds(service, job_id: str) -> list[str]:
    return [event["kind"] for event in service.events(job_id)]


def test_a_queued_job_whose_message_redis_lost_is_sent_again_and_runs(service, redis_server):
    worker = service.start_worker()
    running = service.submit({"base_model": TINY_MODEL, "terms": ["multiprogramming"], "training": LONG})
    service.wait_for_training(running["id"])
    waiting = service.submit({"base_model": TINY_MODEL, "terms": ["hypertext"], "training": SHORT, "evaluation": QUICK_EVAL})

    # Waiting behind a busy worker longer than requeue_after_s is not "lost": nothing is re-sent.
    time.sleep(service.settings.requeue_after_s + 4 * service.settings.sweep_interval_s)
    assert service.queue_length(redis_server) == 1 and "requeued" not in _kinds(service, waiting["id"])

    redis_server.restart_empty()
    assert service.queue_length(redis_server) == 0  # the message is gone; the database still says queued
    service.wait_until_answering(worker)
    service.cancel(running["id"])  # the worker becomes free
    done = service.wait_for_status(waiting["id"], {"succeeded", "failed"}, 120)
    assert done["status"] == "succeeded", done
    requeued = [e["payload"] for e in service.events(waiting["id"]) if e["kind"] == "requeued"]
    assert len(requeued) == 1 and requeued[0]["count"] == 1 and "no longer held" in requeued[0]["message"]
    assert done["attempt"] == 1


def test_a_job_whose_message_keeps_getting_lost_fails_with_the_fix_named(fault_settings, redis_server):
    settings = fault_settings.model_copy(update={"max_requeues": 2, "requeue_after_s": 0.5})
    with open_service(settings) as service:  # no worker: the message can only wait, or be lost
        job = service.submit({"base_model": TINY_MODEL, "terms": ["hypertext"], "training": SHORT})
        for _ in range(settings.max_requeues + 1):
            service.wait_for(job["id"], lambda _job: service.queue_length(redis_server) == 1, 30, "its message in the queue")
            redis_server.restart_empty()
        failed = service.wait_for_status(job["id"], {"failed"}, 30)
    assert failed["error"]["code"] == "queue_message_lost"
    assert "3 times" in failed["error"]["message"] and "appendonly yes" in failed["error"]["message"]
    assert _kinds(service, job["id"]).count("requeued") == 2


def test_a_job_no_worker_starts_in_time_fails_with_its_queue_named(fault_settings, redis_server):
    settings = fault_settings.model_copy(update={"max_queued_hours": 1.5 / 3600})
    with open_service(settings) as service:  # nobody consumes the queue
        job = service.submit({"base_model": TINY_MODEL, "terms": ["hypertext"], "training": SHORT})
        failed = service.wait_for_status(job["id"], {"failed"}, 30)
    assert failed["error"]["code"] == "queue_timeout"
    assert settings.queue in failed["error"]["message"] and "no worker" in failed["error"]["message"]
    assert service.queue_length(redis_server) == 1  # its message may still come: the claim then says "already failed"
