"""The service under test, for real: Redis at 127.0.0.1:6379, one `tide worker` subprocess shared
by the whole session, a SQLite database and the API in-process (TestClient, lifespan running).

Each session gets its own data folder, a Redis database reserved for tests and a queue name of
its own, so leftovers of other runs (or other engineers' runs) never reach this worker.
"""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import CACHE, REPO

REDIS_DB = int(os.environ.get("TIDE_TEST_REDIS_DB", "13"))
FOLDOC = Path("/usr/share/dictd/foldoc.dict.dz")
TINY_MODEL = "tiny-llama"


def foldoc_text(max_chars: int) -> str:
    with gzip.open(FOLDOC, "rt", encoding="utf-8", errors="replace") as handle:
        return handle.read(max_chars)


def foldoc_documents(count: int, skip: int = 0) -> list[str]:
    """FOLDOC entries (blank-line separated paragraphs), whitespace tidied."""
    text = foldoc_text(3_000_000)
    blocks = [" ".join(b.split()) for b in text.split("\n\n")]
    blocks = [b for b in blocks if len(b) > 80]
    return blocks[skip:skip + count]


@pytest.fixture(scope="session")
def redis_url() -> str:
    import redis

    url = f"redis://127.0.0.1:6379/{REDIS_DB}"
    try:
        redis.Redis.from_url(url, socket_connect_timeout=2).ping()
    except redis.exceptions.ConnectionError as exc:
        pytest.fail(
            f"the service tests need a real Redis at 127.0.0.1:6379 and it is not answering ({exc}); "
            "start one with `redis-server --daemonize yes` (.ci/run does this)",
            pytrace=False,
        )
    return url


def build_tiny_model(target: Path) -> None:
    """A tiny random Llama with a real byte-level BPE tokenizer trained on FOLDOC text."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator(foldoc_documents(3000, skip=50), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|endoftext|>", eos_token="<|endoftext|>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    staging = target.with_name(target.name + ".partial")
    model.save_pretrained(staging)
    fast.save_pretrained(staging)
    staging.rename(target)


@pytest.fixture(scope="session")
def service_settings(tmp_path_factory, redis_url, builtin_tokenizers_in_cache):
    from app.settings import Settings

    from filelock import FileLock

    data_dir = tmp_path_factory.mktemp("tide-service")
    models_dir = data_dir / "models"
    models_dir.mkdir()
    cached = CACHE / "service-tiny-llama"  # built once per checkout (a few seconds)
    cached.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(cached) + ".lock"):
        if not (cached / "config.json").exists():
            build_tiny_model(cached)
    (models_dir / TINY_MODEL).symlink_to(cached, target_is_directory=True)
    return Settings(
        data_dir=data_dir,
        cache_dir=CACHE,  # the converted SmolLM2 is shared with the rest of the suite
        models_dir=models_dir,
        redis_url=redis_url,
        queue=f"tide-test-{uuid.uuid4().hex[:12]}",
        max_terms=50,
        max_upload_bytes=256 * 1024,
        max_corpus_text_chars=200_000,
        max_active_jobs_per_key=1000,  # these tests leave queued jobs behind on purpose; tests/faults tests the limit
        max_submits_per_minute_per_key=0,  # no rate limit: tests/faults/test_dead_messages.py tests it
        lease_s=3,  # short, so the takeover test needs seconds, not minutes
        cancel_poll_s=0.2,
        sweep_interval_s=1.0,
        worker_nice=0,
    )


def settings_env(settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
    for name, value in settings.model_dump().items():
        if value is not None:
            env[f"TIDE_{name.upper()}"] = str(value)
    return env


def _queue_keys_cleanup(settings) -> None:
    import redis

    client = redis.Redis.from_url(settings.redis_url)
    for key in client.scan_iter(match=f"*{settings.queue}*"):
        client.delete(key)
    client.close()


def wait_for_worker(queue, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if queue.workers() > 0:
            return
        time.sleep(0.5)
    raise AssertionError(f"no worker answered on queue {queue.settings.queue} within {timeout:.0f} s")


class WorkerProcess:
    """`tide worker` in its own process group (so its job child dies with it)."""

    def __init__(self, settings, log_path: Path):
        self.settings = settings
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("tide")), "worker", "--loglevel=info", f"--hostname=test-{uuid.uuid4().hex[:6]}@%h"],
            cwd=REPO, env=settings_env(self.settings), stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

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


@pytest.fixture(scope="session")
def app(service_settings):
    from app.main import create_app

    return create_app(service_settings)


@pytest.fixture(scope="session")
def client(app):
    from fastapi.testclient import TestClient

    with TestClient(app) as test_client:  # runs the lifespan: the sweeper is live
        yield test_client


@pytest.fixture(scope="session")
def worker(service_settings, app):
    process = WorkerProcess(service_settings, service_settings.data_dir / "worker.log")
    process.start()
    try:
        wait_for_worker(app.state.queue)
        yield process
    finally:
        process.stop()
        _queue_keys_cleanup(service_settings)


def _make_key(app, name: str) -> str:
    from app.db.keys import create_key

    with app.state.sessions() as session:
        return create_key(session, name)[1]


@pytest.fixture(scope="session")
def api_key(app) -> str:
    return _make_key(app, "tests")


@pytest.fixture(scope="session")
def other_key(app) -> str:
    return _make_key(app, "someone-else")


@pytest.fixture(scope="session")
def auth(api_key) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


def wait_for_status(client, auth, job_id: str, statuses: set[str], timeout: float, worker: WorkerProcess | None = None) -> dict:
    deadline = time.monotonic() + timeout
    job = {}
    while time.monotonic() < deadline:
        job = client.get(f"/jobs/{job_id}", headers=auth).json()
        if job.get("status") in statuses:
            return job
        time.sleep(0.2)
    tail = worker.log_tail() if worker else ""
    raise AssertionError(f"job {job_id} not in {statuses} after {timeout:.0f} s: {job}\n--- worker log ---\n{tail}")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def live_server(service_settings, worker):
    """A real uvicorn serving the app on 127.0.0.1 (same database, queue and worker as `client`),
    for the browser and the HTTP client. Yields its base URL; its log is at data_dir/uvicorn.log."""
    import httpx

    port = _free_port()
    log_path = service_settings.data_dir / "uvicorn.log"
    env = {**settings_env(service_settings), "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"uvicorn did not start:\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
