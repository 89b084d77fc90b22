"""Issue 13 item 11: when a worker dies the job says so (a worker_lost event, queued again, the
attempt in its status events) within lease + sweep interval, the next attempt resumes from the last
checkpoint, and a death on the last attempt fails the job at once. Workers are killed whole (parent
and job child, SIGKILL), as when a host loses power: the message stays unacknowledged in Redis, so
only the lease can tell."""

from __future__ import annotations

import time
from datetime import datetime

from .conftest import LONG, TINY_MODEL, open_service

# trains until its workers die (tiny steps run 100x slower on a loaded machine than on an idle one)
TRAIN = {**LONG, "checkpoint_every": 10}


def _event(service, job_id: str, kind: str) -> dict | None:
    return next((e for e in service.events(job_id) if e["kind"] == kind), None)


def _holder(service, job_id: str, workers) -> object:
    running = [e["payload"] for e in service.events(job_id) if e["kind"] == "status" and e["payload"]["status"] == "running"]
    node = running[-1]["worker"].split(":")[0]
    return next(w for w in workers if w.name == node)


def test_a_dead_workers_job_is_marked_lost_resumed_by_another_then_failed_after_the_last_attempt(fault_settings):
    settings = fault_settings.model_copy(update={"max_attempts": 2})
    with open_service(settings) as service:
        workers = [service.start_worker(), service.start_worker()]
        job = service.submit({"base_model": TINY_MODEL, "terms": ["multiprogramming"], "training": TRAIN})
        at_kill = service.wait_for_training(job["id"], min_step=25)  # after two checkpoints
        holder = _holder(service, job["id"], workers)
        killed_at = time.time()
        holder.kill()

        service.wait_for(job["id"], lambda _job: _event(service, job["id"], "worker_lost") is not None, 30, "a worker_lost event")
        lost = _event(service, job["id"], "worker_lost")
        noticed = datetime.fromisoformat(lost["created_at"]).timestamp()
        # never before the lease ran out, and no later than one sweep after it (plus a loaded machine's slack)
        assert datetime.fromisoformat(lost["payload"]["lease_expired_at"]).timestamp() <= noticed
        assert noticed - killed_at < settings.lease_s + settings.sweep_interval_s + 5
        assert lost["payload"]["attempt"] == 1 and lost["payload"]["max_attempts"] == 2 and lost["payload"]["stage"] == "train"
        assert lost["payload"]["step"] >= at_kill["progress"]["step"] and "resumes from the last training checkpoint" in lost["payload"]["message"]

        service.wait_for(job["id"], lambda _job: _event(service, job["id"], "train_resumed") is not None, 120, "training resumed")
        resumed = _event(service, job["id"], "train_resumed")["payload"]
        # the last checkpoint, so never one older than the step the job had recorded. Progress reaches the
        # database throttled (worker/runner.py: twice a second), and tiny steps can run dozens in that
        # half second, so the recorded step may trail the last checkpoint by any number of steps: only the
        # lower bound is exact
        every = TRAIN["checkpoint_every"]
        assert resumed["step"] % every == 0 and resumed["step"] >= lost["payload"]["step"] // every * every >= 20
        assert resumed["step"] < TRAIN["steps"]
        again = service.wait_for_training(job["id"], min_step=resumed["step"] + 1)
        assert again["attempt"] == 2
        survivor = next(w for w in workers if w is not holder)
        assert _holder(service, job["id"], workers) is survivor

        survivor.kill()  # the last attempt's worker dies too: failed at once, not queued again
        failed = service.wait_for_status(job["id"], {"failed", "succeeded"}, 30)
    assert failed["error"]["code"] == "max_attempts_exceeded" and "limit is 2 attempts" in failed["error"]["message"]
    assert failed["attempt"] == 2
    statuses = [(e["payload"]["status"], e["payload"].get("attempt")) for e in service.events(job["id"]) if e["kind"] == "status"]
    assert statuses == [("queued", None), ("running", 1), ("queued", 1), ("running", 2), ("failed", None)]
    assert not (settings.resolved_work_dir / job["id"]).exists()  # nobody resumes it: its checkpoints are gone
