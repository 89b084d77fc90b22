"""What a dead worker costs a user, and what the heartbeat costs the database, per lease setting.

Part A, the price of heartbeats: a job trains in this process (worker.runner.execute, as a
worker's child runs it) while every SQL statement it sends is counted and timed by kind:
heartbeat (lease renewal, every TIDE_LEASE_S/3), job-row updates (stage, progress: at most two a
second), event inserts, cancel-flag reads (every TIDE_CANCEL_POLL_S).

Part B, the detection delay: two real `tide worker` processes, the API in-process with its
sweeper, Redis at 127.0.0.1:6379 (database 14, a queue of this run's own), SQLite. A job trains on
the tiny model; at a random moment the whole worker holding it is SIGKILLed (parent and child, a
host losing power); measured from the kill: when the job says `worker_lost`, and when the other
worker has taken it over (status running, attempt 2). The same trial repeats per setting.

    .venv/bin/python benchmarks/worker_loss.py            # writes benchmarks/results/worker_loss.md
    .venv/bin/python benchmarks/worker_loss.py --configs 20:5 --trials 3 --out /tmp/worker_loss.md
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
TIDE = str(Path(sys.executable).with_name("tide"))
CACHE = Path(os.environ.get("TIDE_TEST_CACHE", REPO / ".cache"))
REDIS_URL = "redis://127.0.0.1:6379/14"
TINY = "tiny-llama"
TRAIN = {"steps": 100_000, "batch_size": 2, "seq_len": 64, "warmup_steps": 0, "checkpoint_every": 20}


def tiny_model_dir() -> Path:
    from filelock import FileLock

    from tests.service.conftest import build_tiny_model  # the service tests' tiny Llama (real BPE tokenizer)

    target = CACHE / "service-tiny-llama"
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if not (target / "config.json").exists():
            build_tiny_model(target)
    return target


def make_settings(root: Path, lease_s: int, sweep_s: float):
    from app.settings import Settings

    models = root / "models"
    models.mkdir(parents=True, exist_ok=True)
    if not (models / TINY).exists():
        (models / TINY).symlink_to(tiny_model_dir(), target_is_directory=True)
    return Settings(
        data_dir=root / f"lease{lease_s}-sweep{sweep_s:g}", cache_dir=CACHE, models_dir=models, redis_url=REDIS_URL,
        queue=f"tide-bench-loss-{uuid.uuid4().hex[:8]}", lease_s=lease_s, sweep_interval_s=sweep_s, worker_nice=10,
    )


def env_for(settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    env["PYTHONPATH"] = str(REPO)
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"TIDE_{name.upper()}"] = str(value)
    return env


# -- part A: statements per second while a job trains ------------------------------------------

def classify(statement: str) -> str:
    text = " ".join(statement.split()).upper()
    if text.startswith("UPDATE JOBS SET LEASE_EXPIRES_AT"):
        return "heartbeat"
    if text.startswith("UPDATE JOBS"):
        return "job row"
    if text.startswith("INSERT INTO EVENTS"):
        return "event"
    if text.startswith("SELECT JOBS.STATUS, JOBS.CLAIM_TOKEN"):
        return "cancel read"
    return "other"


def heartbeat_cost(root: Path, lease_s: int, seconds: float) -> dict:
    from fastapi.testclient import TestClient
    from sqlalchemy import event, update
    from sqlalchemy.engine import Engine

    from app.db.models import Job
    from app.main import create_app
    from worker.runner import execute, sessions_for

    settings = make_settings(root, lease_s, 3600.0)  # no sweeps during the measurement
    app = create_app(settings)
    counts: dict[str, int] = {}
    measuring = threading.Event()

    def after(_conn, _cursor, statement, _parameters, _context, _many):
        if measuring.is_set():
            kind = classify(statement)
            counts[kind] = counts.get(kind, 0) + 1

    # the whole heartbeat transaction (UPDATE, SELECT, COMMIT), as the heartbeat thread calls it
    from app.db import jobs as job_state

    renew = job_state.heartbeat
    renewals: list[float] = []

    def timed_renew(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return renew(*args, **kwargs)
        finally:
            if measuring.is_set():
                renewals.append(time.perf_counter() - t0)

    job_state.heartbeat = timed_renew
    event.listen(Engine, "after_cursor_execute", after)
    try:
        with TestClient(app) as client:
            from app.db.keys import create_key

            with app.state.sessions() as session:
                auth = {"Authorization": f"Bearer {create_key(session, 'bench')[1]}"}
            job = client.post("/extend", json={"base_model": TINY, "terms": ["multiprogramming"], "training": TRAIN}, headers=auth).json()
            runner = threading.Thread(target=execute, args=(job["id"], settings), daemon=True)
            runner.start()
            while client.get(f"/jobs/{job['id']}", headers=auth).json()["stage"] != "train":
                time.sleep(0.2)
            measuring.set()
            time.sleep(seconds)
            measuring.clear()
            steps_done = client.get(f"/jobs/{job['id']}", headers=auth).json()["progress"]["step"]
            with sessions_for(settings)() as db:  # cancel: the job stops at its next check
                db.execute(update(Job).where(Job.id == job["id"]).values(status="cancelling"))
                db.commit()
            runner.join(timeout=120)
            _drop_queue(settings)
    finally:
        job_state.heartbeat = renew
        event.remove(Engine, "after_cursor_execute", after)
    return {
        "renew_ms": [1000 * r for r in renewals],
        "lease_s": lease_s, "seconds": seconds, "steps": steps_done,
        "per_s": {kind: n / seconds for kind, n in counts.items()},
    }


def _drop_queue(settings) -> None:
    import redis

    client = redis.Redis.from_url(settings.redis_url)
    for key in client.scan_iter(match=f"*{settings.queue}*"):
        client.delete(key)
    client.close()


# -- part B: kill a worker, time what the job says ----------------------------------------------

class Worker:
    def __init__(self, settings, folder: Path):
        self.name = f"bench-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        self.log = (folder / f"{self.name.split('@')[0]}.log").open("ab")
        self.proc = subprocess.Popen(
            [TIDE, "worker", "--loglevel=warning", f"--hostname={self.name}"], cwd=REPO, env=env_for(settings),
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self.log.close()


def _wait(predicate, timeout: float, what: str, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise RuntimeError(f"{what}: not within {timeout:.0f} s")


def detection_delays(root: Path, lease_s: int, sweep_s: float, trials: int, rng: random.Random) -> dict:
    from fastapi.testclient import TestClient

    from app.db.keys import create_key
    from app.db.models import Job
    from app.main import create_app

    settings = make_settings(root, lease_s, sweep_s)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    app = create_app(settings)
    inspect = lambda name: app.state.queue.celery.control.inspect(destination=[name], timeout=1.0).ping()  # noqa: E731
    noticed, taken_over, gaps = [], [], []
    with TestClient(app) as client:
        with app.state.sessions() as session:
            auth = {"Authorization": f"Bearer {create_key(session, 'bench')[1]}"}
        workers = [Worker(settings, settings.data_dir) for _ in range(2)]
        try:
            for worker in workers:
                _wait(lambda w=worker: inspect(w.name), 120, f"worker {worker.name} answering", 0.3)
            for trial in range(trials):
                job_id = client.post("/extend", json={"base_model": TINY, "terms": ["multiprogramming"], "training": TRAIN}, headers=auth).json()["id"]

                def row():
                    with app.state.sessions() as db:
                        return db.query(Job).filter_by(id=job_id).one()

                _wait(lambda: row().stage == "train", 300, "training")
                # watch the lease renewals for a while, then kill at a random phase of the heartbeat
                renewals, until = set(), time.monotonic() + lease_s / 3 + rng.uniform(0, lease_s / 3)
                while time.monotonic() < until:
                    renewals.add(row().lease_expires_at)
                    time.sleep(0.1)
                stamps = sorted(r.timestamp() - lease_s for r in renewals if r is not None)
                gaps += [b - a for a, b in zip(stamps, stamps[1:])]
                holder_name = row().worker.split(":")[0]
                holder = next(w for w in workers if w.name == holder_name)
                killed_at = time.time()
                holder.kill()

                def events(kind):
                    data = client.get(f"/jobs/{job_id}/events", params={"limit": 1000}, headers=auth).json()["data"]
                    return [e for e in data if e["kind"] == kind]

                lost = _wait(lambda: events("worker_lost"), lease_s + 3 * sweep_s + 60, "worker_lost", 0.1)[0]
                second = _wait(lambda: [e for e in events("status") if e["payload"].get("attempt") == 2 and e["payload"]["status"] == "running"],
                               lease_s + 3 * sweep_s + 120, "attempt 2 running", 0.1)[0]
                noticed.append(datetime.fromisoformat(lost["created_at"]).timestamp() - killed_at)
                taken_over.append(datetime.fromisoformat(second["created_at"]).timestamp() - killed_at)
                print(f"  lease {lease_s} s, sweep {sweep_s:g} s, trial {trial + 1}: worker_lost after {noticed[-1]:.1f} s, "
                      f"running again after {taken_over[-1]:.1f} s", flush=True)
                client.post(f"/jobs/{job_id}/cancel", headers=auth)
                _wait(lambda: row().status == "cancelled", 120, "cancelled")
                workers.remove(holder)
                workers.append(Worker(settings, settings.data_dir))
                _wait(lambda: inspect(workers[-1].name), 120, "replacement worker answering", 0.3)
        finally:
            for worker in workers:
                worker.kill()
            _drop_queue(settings)
    return {"lease_s": lease_s, "sweep_s": sweep_s, "noticed": noticed, "taken_over": taken_over, "gaps": gaps}


# -- report -------------------------------------------------------------------------------------

def _spread(values: list[float]) -> str:
    if not values:
        return "—"
    return f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})"


def render(args, costs: list[dict], delays: list[dict], load_before, load_after, started: str) -> str:
    lines = [
        "# A dead worker: detection delay and heartbeat cost per lease setting",
        "",
        f"Command: `.venv/bin/python benchmarks/worker_loss.py --configs {' '.join(args.configs)} --trials {args.trials} "
        f"--old-trials {args.old_trials} --cost-seconds {args.cost_seconds:g} --cost-leases {' '.join(map(str, args.cost_leases))}`",
        f"Machine: {os.cpu_count()} CPU cores, no GPU, Python {platform.python_version()}, {platform.platform()}.",
        f"Run: {started}; load average (1/5/15 min) {'/'.join(f'{x:.1f}' for x in load_before)} before, "
        f"{'/'.join(f'{x:.1f}' for x in load_after)} after (other people's work shares these cores).",
        "",
        "## A. Database statements per running job (SQLite, WAL)",
        "",
        f"A job trains the tiny model for {args.cost_seconds:g} s in this process; every statement it sends is counted.",
        "Job-row updates are stage/progress writes (throttled to two a second); the cancel flag is read every",
        "`TIDE_CANCEL_POLL_S` (1 s).",
        "",
        "| TIDE_LEASE_S | heartbeats/s (expected 3/lease) | job-row writes/s | event inserts/s | cancel reads/s | one heartbeat transaction, ms mean / max | training steps |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for cost in costs:
        per_s, renew_ms = cost["per_s"], cost["renew_ms"]
        timing = f"{statistics.mean(renew_ms):.1f} / {max(renew_ms):.1f}" if renew_ms else "—"
        lines.append(
            f"| {cost['lease_s']} | {per_s.get('heartbeat', 0):.3f} ({3 / cost['lease_s']:.3f}) | {per_s.get('job row', 0):.2f} | "
            f"{per_s.get('event', 0):.2f} | {per_s.get('cancel read', 0):.2f} | {timing} | {cost['steps']} |"
        )
    lines += [
        "",
        "## B. Worker killed whole (SIGKILL of parent and job child) while its job trains",
        "",
        "Seconds from the kill: median (min–max). `worker_lost` is when the job says what happened (status back to",
        "`queued`); `running again` is when the second worker has claimed it (attempt 2). Heartbeat gap: time between",
        "two lease renewals seen in the database before the kill (the renewal interval is lease/3; a gap reaching",
        "the lease would let a live job be taken over).",
        "",
        "| TIDE_LEASE_S | TIDE_SWEEP_INTERVAL_S | trials | worker_lost after | running again after | expected worker_lost window | max heartbeat gap (interval) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for delay in delays:
        lease, sweep = delay["lease_s"], delay["sweep_s"]
        window = f"{2 * lease / 3:.0f}–{lease + sweep:.0f}"
        gap = f"{max(delay['gaps']):.1f} ({lease / 3:.1f})" if delay["gaps"] else f"— ({lease / 3:.1f})"
        lines.append(
            f"| {lease} | {sweep:g} | {len(delay['noticed'])} | {_spread(delay['noticed'])} | {_spread(delay['taken_over'])} | {window} | {gap} |"
        )
    lines += [
        "",
        "Reading it: a worker renews its lease every lease/3 s, so when it dies the lease runs out between 2/3 of",
        "a lease and a whole lease later, and the next sweep (every TIDE_SWEEP_INTERVAL_S) notices: the expected",
        "window above. Until then the job shows its last progress as `running`. Heartbeats cost 3/lease UPDATEs a",
        "second per running job, next to the progress writes a training job makes anyway; the price of a shorter",
        "lease is the tolerance to a stalled heartbeat (database unreachable, process paused), since a lease",
        "that runs out takes a live job away from its worker (it stops, another resumes from the checkpoint).",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", nargs="+", default=["20:5", "9:2"], help="LEASE_S:SWEEP_INTERVAL_S pairs measured with --trials each")
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--old-trials", type=int, default=3, help="trials of the old defaults 60:60 (about 100 s each; 0 skips)")
    parser.add_argument("--cost-seconds", type=float, default=40.0)
    parser.add_argument("--cost-leases", type=int, nargs="+", default=[60, 20, 9])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "worker_loss.md")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = datetime.now().isoformat(timespec="seconds")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tide-worker-loss-") as folder:
        root = Path(folder)
        costs = []
        for lease in args.cost_leases:
            print(f"part A: lease {lease} s", flush=True)
            costs.append(heartbeat_cost(root / "cost", lease, args.cost_seconds))
        configs = [(60, 60.0, args.old_trials)] if args.old_trials else []
        configs += [(int(c.split(":")[0]), float(c.split(":")[1]), args.trials) for c in args.configs]
        delays = []
        for lease, sweep, trials in configs:
            print(f"part B: lease {lease} s, sweep {sweep:g} s", flush=True)
            delays.append(detection_delays(root / "loss", lease, sweep, trials, rng))
    report = render(args, costs, delays, load_before, os.getloadavg(), started)
    args.out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
