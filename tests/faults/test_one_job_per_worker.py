"""Issue 13 item 2: one job per worker means one, also after the broker connection drops.

Before worker_disable_prefetch, a worker whose Redis connection was re-established while it ran a
job reserved the next job at once (the running job's message belonged to the dead channel, so the
new channel's prefetch window of one was empty), and that job waited behind the busy one while
another worker sat idle."""

from __future__ import annotations

import time

from .conftest import LONG, QUICK_EVAL, SHORT, TINY_MODEL


def test_after_redis_restarts_a_busy_worker_reserves_nothing_and_an_idle_one_takes_the_job(service, redis_server):
    busy = service.start_worker()
    running = service.submit({"base_model": TINY_MODEL, "terms": ["multiprogramming"], "training": LONG})
    service.wait_for_training(running["id"])

    redis_server.restart_empty()  # every connection drops; the running job's message is gone with it
    service.wait_until_answering(busy)

    waiting = service.submit({"base_model": TINY_MODEL, "terms": ["hypertext"], "training": SHORT, "evaluation": QUICK_EVAL})
    # The busy worker polls the queue every second when it may consume; give it a few chances.
    time.sleep(3)
    inspect = service.app.state.queue.celery.control.inspect(destination=[busy.name], timeout=2.0)
    reserved = inspect.reserved()
    assert reserved is not None and reserved[busy.name] == [], reserved  # `celery inspect reserved`: nothing extra
    assert [task["args"] for task in inspect.active()[busy.name]] == [[running["id"]]]
    assert service.queue_length(redis_server) == 1  # the new job still waits in Redis for a free worker
    assert service.job(waiting["id"])["status"] == "queued"

    idle = service.start_worker()
    done = service.wait_for_status(waiting["id"], {"succeeded", "failed"}, 120)
    assert done["status"] == "succeeded", done
    started = [e["payload"] for e in service.events(waiting["id"]) if e["kind"] == "status" and e["payload"]["status"] == "running"]
    assert [payload["worker"].split(":")[0] for payload in started] == [idle.name]
    assert service.job(running["id"])["status"] == "running"  # still on the busy worker all along
    service.cancel(running["id"])
    service.wait_for_status(running["id"], {"cancelled"}, 30)
