"""Issue 38, item 2: the first parallel submits after an API start. The base tokenizer of a
submit-time check was loaded with a lazy `from transformers import PreTrainedTokenizerFast`;
eight request threads reaching it at once made transformers' lazy module raise ImportError in
all but one (500 internal_error, 7 of 8, in every restart). Now the import and the built-in
models' tokenizers are loaded while the API starts, before it answers anything."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import httpx

from tests.conftest import REPO

from .conftest import TINY_MODEL, _free_port, _make_key, _queue_keys_cleanup, settings_env

PARALLEL = 8
RESTARTS = 3


def _start(settings, log_path) -> tuple[subprocess.Popen, str]:
    """A real uvicorn with its lifespan (as `tide serve` runs it); returns once /healthz answers."""
    port = _free_port()
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO, env={**settings_env(settings), "PYTHONPATH": str(REPO)}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
        time.sleep(0.05)


def _stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _parallel_submits(url: str, key: str, round_: int) -> list[tuple[int, str]]:
    barrier = threading.Barrier(PARALLEL)
    answers: list[tuple[int, str]] = [(0, "")] * PARALLEL

    def one(index: int) -> None:
        body = {"base_model": TINY_MODEL, "terms": [f"multiprogramming{round_}x{index}"], "training": {"steps": 1}}
        barrier.wait()
        try:
            response = httpx.post(f"{url}/extend", json=body, headers={"Authorization": f"Bearer {key}"}, timeout=60)
            answers[index] = (response.status_code, response.text[:300])
        except httpx.TransportError as exc:  # uvicorn closed the connection after the 500
            answers[index] = (-1, repr(exc))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(PARALLEL)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return answers


def test_the_first_parallel_submits_after_a_start_are_all_accepted(service_settings, app, tmp_path):
    # A queue of its own: no worker consumes it, so the jobs only wait (and are cleaned up).
    settings = service_settings.model_copy(update={"queue": f"tide-test-start-{uuid.uuid4().hex[:8]}"})
    key = _make_key(app, "start-up")
    log_path = tmp_path / "uvicorn.log"
    try:
        for round_ in range(RESTARTS):
            proc, url = _start(settings, log_path)
            try:
                answers = _parallel_submits(url, key, round_)
            finally:
                _stop(proc)
            statuses = [status for status, _text in answers]
            assert statuses == [202] * PARALLEL, (
                f"start {round_ + 1}: {answers}\n--- uvicorn log ---\n{log_path.read_text(errors='replace')[-3000:]}"
            )
        assert "ImportError" not in log_path.read_text(errors="replace")
    finally:
        _queue_keys_cleanup(settings)
