"""Options whose default depends on the device the job runs on (`device_defaults` in
extension/plan/options.py; today training.steps: 150 on a CPU, 250 on a CPU that computes bf16 in
hardware (precision auto), 400 on a GPU, and
training.max_train_seconds: 7200 and 3600). A request leaves them unset; the server's limits and
the job's progress account for every device its workers may have; the worker fills in its own
device's default and tide_extension.json says which it used."""

from __future__ import annotations

import json

import pytest
import torch

from extension.plan.devices import cpu_computes_bf16
from extension.plan.options import BY_NAME, defaults_for_device
from extension.plan.spec import ExtendSpec

from .conftest import TINY_MODEL, wait_for_status
from .test_api_inputs import assert_error, submit

TERMS = ["multiprogramming", "hypertext"]
SMALL = {"batch_size": 2, "seq_len": 32, "warmup_steps": 0, "checkpoint_every": 0}


def test_an_unset_option_takes_the_default_of_the_device():
    unset = ExtendSpec(base_model="m", out_dir="o", terms=["kernel"])
    assert unset.steps is None and unset.max_train_seconds is None and unset.term_contexts is None
    contexts = {"term_contexts": 4, "term_context_tokens": 64}  # a terms-only job's contexts: what a CPU affords
    assert defaults_for_device(unset, "cpu") == {"steps": BY_NAME["steps"].default, "max_train_seconds": 7200,
                                                 **contexts} == {"steps": 150, "max_train_seconds": 7200, **contexts}
    # a GPU: Token Distillation's 100 contexts of 50 tokens per term
    assert defaults_for_device(unset, "cuda") == {"steps": 400, "max_train_seconds": 3600, "term_contexts": 100,
                                                  "term_context_tokens": 50}
    assert defaults_for_device(unset, "cpu_bf16") == {"steps": 250, "max_train_seconds": 7200, **contexts}
    assert defaults_for_device(ExtendSpec(base_model="m", out_dir="o", terms=["kernel"], steps=7, max_train_seconds=60,
                                          term_contexts=3, term_context_tokens=20), "cuda") == {}
    assert BY_NAME["steps"].default_text == ("150 on a CPU, 250 on a CPU that computes bf16 in hardware (AMX or AVX-512 "
                                             "BF16; precision auto), 400 on a GPU (cuda)")
    assert BY_NAME["steps"].defaults_for_setting("cpu") == [150, 250]
    assert BY_NAME["steps"].defaults_for_setting("cpu", "checkpoint") == [150]
    assert BY_NAME["steps"].defaults_for_setting("auto", "checkpoint") == [150, 400]
    assert BY_NAME["steps"].defaults_for_setting("cuda:1") == [400]
    assert BY_NAME["max_train_seconds"].default_text == "7200 on a CPU, 3600 on a GPU (cuda)"


@pytest.fixture()
def side_client(service_settings, tmp_path):
    """A second app on its own database whose queue no worker reads: jobs stay queued."""
    from fastapi.testclient import TestClient

    from app.db.keys import create_key
    from app.main import create_app

    def make(**settings_update):
        settings = service_settings.model_copy(update={"data_dir": tmp_path / str(len(apps)), "queue": "tide-nobody-listens",
                                                       **settings_update})
        side = create_app(settings)
        apps.append(side)
        with side.state.sessions() as session:
            headers = {"Authorization": f"Bearer {create_key(session, 'side')[1]}"}
        return TestClient(side), headers

    apps: list = []
    yield make
    for side in apps:
        side.state.queue.close()


def test_a_server_limit_below_a_devices_default_is_named_at_submit(side_client):
    body = {"base_model": TINY_MODEL, "terms": TERMS}
    # workers on "auto" may have a GPU: an unset training.steps can become 400
    client, auth = side_client(max_steps=200, device="auto")
    message = assert_error(submit(client, auth, body), 422, "training.steps", "invalid_option")["message"]
    assert "is unset" in message and "400" in message and "at most 200" in message
    explicit = submit(client, auth, {**body, "training": {"steps": 50}})
    assert explicit.status_code == 202, explicit.text
    assert explicit.json()["progress"]["total"] == 50
    # CPU workers computing in the checkpoint's dtype: a corpus job's default is 150, within the
    # limit, and the progress total is known at submit; a terms-only job trains nothing there
    corpus = {"base_model": TINY_MODEL, "corpus_text": "A compiler reads source text.\n\nAn interrupt stops the processor."}
    client, auth = side_client(max_steps=200, device="cpu", precision="checkpoint")
    accepted = submit(client, auth, corpus)
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["progress"]["total"] == 150 and accepted.json()["request"]["training"]["steps"] is None
    untrained = submit(client, auth, body)
    assert untrained.status_code == 202 and untrained.json()["progress"]["total"] == 0
    # "auto" within the limit: which default applies is the worker's to know, so no total yet
    client, auth = side_client(device="auto")
    queued = submit(client, auth, body)
    assert queued.status_code == 202 and queued.json()["progress"]["total"] == 0
    # CPU workers with precision auto: the worker's CPU decides (150, or 250 computing bf16 in hardware)
    client, auth = side_client(max_steps=200, device="cpu")
    message = assert_error(submit(client, auth, corpus), 422, "training.steps", "invalid_option")["message"]
    assert "can be 250" in message and "at most 200" in message
    # a GPU's terms-only job takes the steps that read its 100 contexts per term: 48 terms x 100 / 4
    client, auth = side_client(max_steps=1000, device="cuda")
    long_list = {"base_model": TINY_MODEL, "terms": [f"word{i}" for i in range(48)]}
    message = assert_error(submit(client, auth, long_list), 422, "training.steps", "invalid_option")["message"]
    assert "can be 1200" in message and "at most 1000" in message


@pytest.mark.slow
def test_a_job_without_steps_trains_its_devices_default_and_says_so(client, auth, worker):
    # with examples: a terms-only job without them trains only where it writes 100 contexts per term
    examples = [f"A note on {term} and how {term} is used." for term in TERMS]
    body = {"base_model": TINY_MODEL, "terms": TERMS, "examples": examples, "training": SMALL, "evaluation": {"max_bytes": 2000}}
    response = client.post("/extend", json=body, headers=auth)
    assert response.status_code == 202, response.text
    job = wait_for_status(client, auth, response.json()["id"], {"succeeded", "failed"}, timeout=600, worker=worker)
    assert job["status"] == "succeeded", job
    # the worker's device and precision settings are "auto"
    device = "cuda" if torch.cuda.is_available() else "cpu_bf16" if cpu_computes_bf16() else "cpu"
    steps = BY_NAME["steps"].default_on(device)
    assert job["request"]["training"]["steps"] is None
    assert job["progress"]["step"] == job["progress"]["total"] == job["metrics"]["training"]["steps"] == steps
    manifest = client.get(job["artifacts"]["manifest_url"], headers=auth).json()
    url = next(f["url"] for f in manifest["files"] if f["path"] == "tide_extension.json")
    extension = json.loads(client.get(url, headers=auth).content)
    assert extension["spec"]["steps"] == extension["trained_steps"] == steps
    per_term = BY_NAME["term_contexts"].default_on(device)
    assert extension["device_defaults"] == {"device": device, "options": {
        "steps": steps, "max_train_seconds": BY_NAME["max_train_seconds"].default_on(device), "term_contexts": per_term,
        "term_context_tokens": BY_NAME["term_context_tokens"].default_on(device)}}
    # the device's contexts per term reached the terms-only job (never more than its steps read)
    assert job["metrics"]["selection"]["contexts"]["per_term"] == min(per_term, steps * SMALL["batch_size"] // len(TERMS))
    assert extension["training"] == {"steps": steps, "planned_steps": steps, "stopped": "steps",
                                     "max_train_seconds": BY_NAME["max_train_seconds"].default_on(device), "validation_patience": 0}
