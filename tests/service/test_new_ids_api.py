"""`new_ids` through the API door (issue 40 item 2): the schema takes 'append' / 'reserved' and
refuses anything else, a job that needs more reserved tokens than the base tokenizer has free (or a
tokenizer with none) is a 422 at submit naming new_ids, and the worker's spec carries the field.
The job itself runs the pipeline tested in tests/test_new_ids_reserved.py."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

from .conftest import TINY_MODEL
from .test_api_inputs import assert_error, submit


def test_new_ids_must_be_append_or_reserved(client, auth):
    error = assert_error(submit(client, auth, {"base_model": TINY_MODEL, "terms": ["multiprogramming"], "new_ids": "free"}),
                         422, "new_ids", "invalid_option")
    assert "'append'" in error["message"] and "'reserved'" in error["message"]


def test_reserved_ids_on_a_tokenizer_without_any_is_refused_at_submit(client, auth):
    error = assert_error(submit(client, auth, {"base_model": TINY_MODEL, "terms": ["multiprogramming"],
                                               "new_ids": "reserved"}), 422, "new_ids", "invalid_option")
    assert "no free reserved tokens" in error["message"] and 'new_ids "append"' in error["message"]


def test_mining_more_than_the_free_reserved_tokens_is_refused_at_submit(client, auth):
    body = {"base_model": "gemma3-270m", "corpus_text": "ciprofloxacin works.\n\nimmunohistochemistry shows it.",
            "mining": {"max_new_tokens": 7000}, "new_ids": "reserved"}
    error = assert_error(submit(client, auth, body), 422, "new_ids", "invalid_option")
    assert "up to 7000 new vocabulary entries" in error["message"] and "only 6242 free reserved tokens" in error["message"]
    assert "mining.max_new_tokens" in error["message"]


def test_a_reserved_job_is_accepted_and_its_worker_spec_carries_new_ids(client, auth):
    from app.settings import Settings
    from worker.runner import build_spec

    response = submit(client, auth, {"base_model": "gemma3-270m", "terms": ["ciprofloxacin"], "new_ids": "reserved",
                                     "training": {"steps": 1}})
    assert response.status_code == 202, response.text
    job = response.json()
    client.post(f"/jobs/{job['id']}/cancel", headers=auth)  # not for the session's worker
    assert job["request"]["new_ids"] == "reserved"
    spec = build_spec(SimpleNamespace(id=job["id"], request=job["request"]), None, Settings(data_dir=Path(os.devnull).parent))
    assert spec.new_ids == "reserved"
    default = build_spec(SimpleNamespace(id="job_x", request={"base_model": TINY_MODEL, "terms": ["x"]}), None,
                         Settings(data_dir=Path(os.devnull).parent))
    assert default.new_ids == "auto"  # the worker decides from the config: append, or reserved on Gemma 3n
