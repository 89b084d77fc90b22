"""The service under faults, with real parts: a redis-server of each test's own (on a free port, so
stopping or wiping it never touches the shared Redis at 6379), real `tide worker` processes, a real
SQLite file and the API in-process with its sweeper running. Leases and sweep intervals are shrunk
through the settings, so a fault plays out in seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import CACHE, REPO
from tests.service.conftest import TINY_MODEL, settings_env

# a short, quick job on the tiny model; LONG trains until cancelled
SHORT = {"steps": 2, "batch_size": 2, "seq_len": 64, "warmup_steps": 0}
LONG = {"steps": 100_000, "batch_size": 2, "seq_len": 64, "warmup_steps": 0, "checkpoint_every": 50}
QUICK_EVAL = {"max_bytes": 2000}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RedisServer:
    """A private redis-server without persistence (no RDB snapshots, no AOF): what a restart loses
    is lost, as with the docs' own `redis-server --daemonize yes` after a crash."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self):
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder), "--logfile", str(self.folder / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                self.client().ping()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise AssertionError(f"redis-server on port {self.port} did not start: {(self.folder / 'redis.log').read_text()[-2000:]}")
                time.sleep(0.05)

    def crash(self) -> None:
        """SIGKILL: the process and everything in its memory are gone."""
        self.proc.kill()
        self.proc.wait(timeout=10)

    def restart_empty(self) -> None:
        self.crash()
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.crash()


class Worker:
    """`tide worker` in its own process group (so its job child dies with it), with a known node name."""

    def __init__(self, settings, log_path: Path):
        self.settings = settings
        self.log_path = log_path
        self.name = f"fault-{uuid.uuid4().hex[:6]}@{socket.gethostname()}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Worker:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("tide")), "worker", "--loglevel=info", f"--hostname={self.name}"],
            cwd=REPO, env=settings_env(self.settings), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        return self

    def kill(self) -> None:
        """The whole worker at once (parent and job child): a host that lost power."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        self._log.close()

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        self._log.close()

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


@pytest.fixture()
def redis_server(tmp_path):
    folder = tmp_path / "redis"
    folder.mkdir()
    server = RedisServer(folder)
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def fault_settings(tmp_path, redis_server, tiny_model_dir, builtin_tokenizers_in_cache):
    from app.settings import Settings

    models_dir = tmp_path / "models"
    models_dir.mkdir()
    (models_dir / TINY_MODEL).symlink_to(tiny_model_dir, target_is_directory=True)
    return Settings(
        data_dir=tmp_path / "data",
        cache_dir=CACHE,
        models_dir=models_dir,
        redis_url=redis_server.url,
        queue=f"tide-faults-{uuid.uuid4().hex[:8]}",
        lease_s=3,
        sweep_interval_s=0.5,
        requeue_after_s=3.0,  # longer than a loaded machine takes from a worker's taking a message to its claim
        cancel_poll_s=0.2,
        worker_nice=0,
        readyz_timeout_s=1.0,
        max_submits_per_minute_per_key=0,  # parallel-submit drills count other limits; test_dead_messages sets its own
    )


class Service:
    """The API (in-process, lifespan and sweeper running) plus the workers a test starts."""

    def __init__(self, settings, client, app):
        self.settings, self.client, self.app = settings, client, app
        self.workers: list[Worker] = []
        with app.state.sessions() as session:
            from app.db.keys import create_key

            self.auth = {"Authorization": f"Bearer {create_key(session, 'faults')[1]}"}

    def start_worker(self, settings=None) -> Worker:
        settings = settings or self.settings
        worker = Worker(settings, settings.data_dir / f"worker-{len(self.workers)}.log").start()
        self.workers.append(worker)
        self.wait_until_answering(worker)
        return worker

    def wait_until_answering(self, worker: Worker, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert worker.proc.poll() is None, f"worker exited:\n{worker.log_tail()}"
            try:
                if self.app.state.queue.celery.control.inspect(destination=[worker.name], timeout=1.0).ping():
                    return
            except Exception:  # the broker is restarting: ask again
                pass
            time.sleep(0.3)
        raise AssertionError(f"worker {worker.name} did not answer within {timeout:.0f} s:\n{worker.log_tail()}")

    def submit(self, body: dict, expect: int = 202) -> dict:
        response = self.client.post("/extend", json=body, headers=self.auth)
        assert response.status_code == expect, response.text
        return response.json()

    def job(self, job_id: str) -> dict:
        return self.client.get(f"/jobs/{job_id}", headers=self.auth).json()

    def events(self, job_id: str) -> list[dict]:
        return self.client.get(f"/jobs/{job_id}/events", params={"limit": 1000}, headers=self.auth).json()["data"]

    def wait_for(self, job_id: str, condition, timeout: float, what: str) -> dict:
        deadline = time.monotonic() + timeout
        job: dict = {}
        while time.monotonic() < deadline:
            job = self.job(job_id)
            if condition(job):
                return job
            time.sleep(0.1)
        logs = "\n".join(f"--- {w.name} ---\n{w.log_tail()}" for w in self.workers)
        raise AssertionError(f"job {job_id}: {what} not seen after {timeout:.0f} s: {job}\n{logs}")

    def wait_for_status(self, job_id: str, statuses: set[str], timeout: float) -> dict:
        return self.wait_for(job_id, lambda job: job["status"] in statuses, timeout, f"status in {statuses}")

    def wait_for_training(self, job_id: str, min_step: int = 1, timeout: float = 120) -> dict:
        def training(job: dict) -> bool:
            assert job["status"] in ("queued", "running"), job
            return job["stage"] == "train" and job["progress"]["step"] >= min_step

        return self.wait_for(job_id, training, timeout, f"training step {min_step}")

    def cancel(self, job_id: str) -> None:
        self.client.post(f"/jobs/{job_id}/cancel", headers=self.auth)

    def queue_length(self, redis_server: RedisServer) -> int:
        return redis_server.client().llen(self.settings.queue)


def open_service(settings):
    """Context manager: the API for these settings, the workers it started stopped at the end."""
    from contextlib import contextmanager

    from fastapi.testclient import TestClient

    from app.main import create_app

    @contextmanager
    def running():
        app = create_app(settings)
        with TestClient(app) as client:
            service = Service(settings, client, app)
            try:
                yield service
            finally:
                for worker in service.workers:
                    worker.stop()

    return running()


@pytest.fixture()
def service(fault_settings):
    with open_service(fault_settings) as running:
        yield running
