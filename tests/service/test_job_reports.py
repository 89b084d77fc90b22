"""What a client is told about its jobs, through the real API, Redis and worker (issue 13,
items 8, 9 and 12): progress in every slow stage (the base model writing contexts for a
terms-only job included), no server path or server file name in any event, metric, artifact or
error, and Range answers in the one error shape."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from tests.conftest import CACHE

from .conftest import TINY_MODEL, foldoc_documents, wait_for_status
from .test_api_inputs import assert_error

pytestmark = pytest.mark.slow

# Terms-only, 80 contexts to generate (20 terms x 4), then enough steps that the job is still
# training when the test kills its process after a checkpoint.
TRAINING = {"steps": 120, "batch_size": 2, "seq_len": 64, "warmup_steps": 0, "checkpoint_every": 20}
TERM_COUNT = 20


def _events(client, auth, job_id: str) -> list[dict]:
    return client.get(f"/jobs/{job_id}/events", params={"limit": 1000}, headers=auth).json()["data"]


def _terms(models_dir) -> list[str]:
    """Long FOLDOC words the tiny model's tokenizer splits into pieces."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast.from_pretrained(models_dir / TINY_MODEL)
    words: list[str] = []
    for word in re.findall(r"[a-z]{9,}", " ".join(foldoc_documents(400, skip=1000))):
        if word not in words and len(tokenizer.encode(word, add_special_tokens=False)) > 2:
            words.append(word)
    return words[:TERM_COUNT]


def _server_paths(settings) -> list[str]:
    paths = {
        settings.data_dir, settings.resolved_uploads_dir, settings.resolved_work_dir, settings.resolved_artifacts_dir,
        settings.resolved_cache_dir, settings.resolved_models_dir, CACHE, (settings.resolved_models_dir / TINY_MODEL).resolve(),
    }
    return sorted({str(p) for p in paths} | {str(p.resolve()) for p in paths} | {"/usr/share", "/tmp/"})


def _assert_no_server_paths(text: str, settings, also: tuple[str, ...] = ()) -> None:
    for needle in [*_server_paths(settings), *also]:
        assert needle not in text, f"{needle!r} reaches the client: ...{text[max(0, text.find(needle) - 200):text.find(needle) + 200]}..."


def _watch_generation(client, auth, job_id: str, worker, timeout: float = 240) -> list[tuple[int, int]]:
    """(step, total) of the job resource while its stage is generate, polled until training starts."""
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/jobs/{job_id}", headers=auth).json()
        assert job["status"] in ("queued", "running"), job
        if job["stage"] == "generate":
            seen.append((job["progress"]["step"], job["progress"]["total"]))
        elif job["stage"] in ("train", "evaluate", "publish"):
            return seen
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} never reached training: {seen}\n{worker.log_tail()}")


def _wait_for_step(client, auth, job_id: str, min_step: int, worker, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/jobs/{job_id}", headers=auth).json()
        assert job["status"] in ("queued", "running"), job
        if job["stage"] == "train" and job["progress"]["step"] >= min_step:
            return
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not reach training step {min_step}\n{worker.log_tail()}")


@pytest.fixture(scope="module")
def jobs(client, auth, worker, app, service_settings):
    """A terms-only job watched through generation, killed mid-training and resumed to success,
    and, queued behind it, a corpus job whose upload vanished from disk: it fails."""
    from app.db.models import StoredFile

    terms = _terms(service_settings.resolved_models_dir)
    assert len(terms) == TERM_COUNT
    response = client.post("/extend", json={
        "base_model": TINY_MODEL, "terms": terms, "training": TRAINING, "evaluation": {"max_bytes": 4000},
    }, headers=auth)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    generation = _watch_generation(client, auth, job_id, worker)
    _wait_for_step(client, auth, job_id, 40, worker)

    text = "\n\n".join(foldoc_documents(60, skip=4000)).encode("utf-8")
    upload = client.post("/files", files={"file": ("my-notes.txt", text)}, headers=auth).json()
    failing = client.post("/extend", json={"base_model": TINY_MODEL, "corpus_file_id": upload["id"], "training": {"steps": 1}}, headers=auth)
    assert failing.status_code == 202, failing.text
    with app.state.sessions() as db:
        os.unlink(db.get(StoredFile, upload["id"]).path)  # gone before the busy worker gets to it

    children = worker.children()
    assert len(children) == 1, children
    os.kill(children[0], signal.SIGKILL)
    done = wait_for_status(client, auth, job_id, {"succeeded", "failed", "cancelled"}, 300, worker)
    assert done["status"] == "succeeded", (done["error"], worker.log_tail())
    failed = wait_for_status(client, auth, failing.json()["id"], {"succeeded", "failed", "cancelled"}, 300, worker)
    assert failed["status"] == "failed", failed
    return {"terms": terms, "generation": generation, "done": done, "failed": failed, "upload": upload}


def test_generation_reports_progress_in_the_job(client, auth, jobs):
    contexts = TERM_COUNT * (4 + 2)  # four contexts per term to train on, two held out: one decides the step, one judges
    seen = jobs["generation"]
    # A stage starts at 0 of 0 until its first count is written.
    counted = [(step, total) for step, total in seen if total]
    assert counted and all(total == contexts for _step, total in counted), seen
    steps = [step for step, _total in counted]
    assert steps == sorted(steps), seen
    events = _events(client, auth, jobs["done"]["id"])
    stages = [e["payload"]["stage"] for e in events if e["kind"] == "stage"]
    assert stages[:5] == ["load", "extend", "init", "generate", "train"], stages
    generating = [e["payload"] for e in events if e["kind"] == "progress" and e["payload"].get("unit") == "contexts"]
    assert generating and all(p["total"] == contexts for p in generating)
    # It moved: the job resource showed the stage at its first count, and its last count (every
    # context written) is always kept as an event. Between them the job row is written at most
    # twice a second, so on a fast machine every batch can land between two polls.
    assert steps[0] < contexts and generating[-1]["step"] == contexts, f"progress did not move while generating: {seen}"
    scoring = [e["payload"] for e in events if e["kind"] == "progress" and e["payload"].get("unit") == "chunks"]
    assert scoring and scoring[-1]["step"] == scoring[-1]["total"]  # evaluation reports progress too


def test_no_server_path_reaches_the_client(client, auth, jobs, service_settings):
    done = jobs["done"]
    events = _events(client, auth, done["id"])
    resumed = [e["payload"] for e in events if e["kind"] == "train_resumed"]
    assert len(resumed) == 1 and "/" not in resumed[0]["checkpoint"], resumed
    assert done["metrics"]["after"]["general"]["source"] == "debian:fortunes"
    texts = [json.dumps(done), json.dumps(events)]
    manifest = client.get(f"/jobs/{done['id']}/artifacts", headers=auth).json()
    for name in ("metrics.json", "tide_extension.json", "README.md"):
        entry = next(f for f in manifest["files"] if f["path"] == name)
        texts.append(client.get(entry["url"], headers=auth).text)
    for text in texts:
        _assert_no_server_paths(text, service_settings)

    failed, upload = jobs["failed"], jobs["upload"]
    assert failed["error"]["code"] == "invalid_corpus" and "corpus" in failed["error"]["message"]
    failed_events = _events(client, auth, failed["id"])
    for text in (json.dumps(failed), json.dumps(failed_events)):
        _assert_no_server_paths(text, service_settings, also=(f"{upload['id']}.txt",))


def test_an_unparseable_range_gets_the_whole_file(client, auth, jobs):
    manifest = client.get(f"/jobs/{jobs['done']['id']}/artifacts", headers=auth).json()
    archive = manifest["archive"]
    for header in ("bytes=abc", "items=0-5", "bytes=5-2", "bytes=", "0-10", "bytes=--5"):
        response = client.get(archive["url"], headers={**auth, "Range": header})
        assert response.status_code == 200, (header, response.status_code, response.text[:200])
        assert len(response.content) == archive["size"], header
    assert client.get(archive["url"], headers={**auth, "Range": "bytes=0-9"}).status_code == 206


def test_a_range_past_the_end_is_416_in_the_error_shape(client, auth, jobs):
    manifest = client.get(f"/jobs/{jobs['done']['id']}/artifacts", headers=auth).json()
    config = next(f for f in manifest["files"] if f["path"] == "config.json")
    for url, size in ((manifest["archive"]["url"], manifest["archive"]["size"]), (config["url"], config["size"])):
        response = client.get(url, headers={**auth, "Range": f"bytes={size}-"})
        error = assert_error(response, 416, "Range", "range_not_satisfiable")
        assert str(size) in error["message"]
        assert response.headers["content-range"] == f"bytes */{size}"
