"""Issue 13 items 1 and 2: a job reaches a worker or fails with a reason, whatever happens to the
broker's memory, and a busy worker takes no second job after Redis comes back. The broker here is
a real redis-server without persistence that the tests crash (SIGKILL) and start again empty; the
workers are real `tide worker` processes; the sweeper is the API's own, running every 0.5 s."""

from __future__ import annotations

import time

from .conftest import LONG, QUICK_EVAL, SHORT, TINY_MODEL, open_service


def _kinds(service, job_id: str) -> list[str]:
    return [event["kind"] for event in service.events(job_id)]


def test_a_job_whose_message_redis_lost_is_sent_again_and_goes_to_an_idle_worker_not_the_busy_one(service, redis_server):
    """Items 1 and 2 in one flow. Before the fix the lost job stayed queued forever; and a busy
    worker whose connection was re-established reserved the next job at once (the running job's
    message belonged to the dead channel, so its new prefetch window of one was empty) while
    another worker idled — worker_disable_prefetch stops that."""
    busy = service.start_worker()
    running = service.submit({"base_model": TINY_MODEL, "terms": ["multiprogramming"], "training": LONG})
    service.wait_for_training(running["id"])
    waiting = service.submit({"base_model": TINY_MODEL, "terms": ["hypertext"], "training": SHORT, "evaluation": QUICK_EVAL})

    # Waiting behind a busy worker longer than requeue_after_s is not "lost": nothing is re-sent.
    time.sleep(service.settings.requeue_after_s + 4 * service.settings.sweep_interval_s)
    assert service.queue_length(redis_server) == 1 and "requeued" not in _kinds(service, waiting["id"])

    redis_server.restart_empty()  # every connection drops; both jobs' messages are gone
    assert service.queue_length(redis_server) == 0  # the database still says queued
    service.wait_until_answering(busy)
    service.wait_for(waiting["id"], lambda _job: "requeued" in _kinds(service, waiting["id"]), 60, "a requeued event")
    requeued = [e["payload"] for e in service.events(waiting["id"]) if e["kind"] == "requeued"]
    assert len(requeued) == 1 and requeued[0]["count"] == 1 and "no longer held" in requeued[0]["message"]

    # The busy worker polls the queue every second when it may consume; give it a few chances.
    time.sleep(3)
    inspect = service.app.state.queue.celery.control.inspect(destination=[busy.name], timeout=2.0)
    reserved = inspect.reserved()
    assert reserved is not None and reserved[busy.name] == [], reserved  # `celery inspect reserved`: nothing extra
    assert [task["args"] for task in inspect.active()[busy.name]] == [[running["id"]]]
    assert service.queue_length(redis_server) == 1 and service.job(waiting["id"])["status"] == "queued"

    idle = service.start_worker()
    done = service.wait_for_status(waiting["id"], {"succeeded", "failed"}, 120)
    assert done["status"] == "succeeded" and done["attempt"] == 1, done
    started = [e["payload"] for e in service.events(waiting["id"]) if e["kind"] == "status" and e["payload"]["status"] == "running"]
    assert [payload["worker"].split(":")[0] for payload in started] == [idle.name]
    assert service.job(running["id"])["status"] == "running"  # still on the busy worker all along
    assert _kinds(service, waiting["id"]).count("requeued") == 1


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
