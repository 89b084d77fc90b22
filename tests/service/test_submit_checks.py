"""What can be known at submit is checked at submit (issue 13, item 10): terms that would add
nothing to the base model, a JSONL text field the upload does not have, invisible characters in
terms. The built-in models' tokenizers are extracted at start-up, so a new server checks its
first request too; where the API cannot have the tokenizer, the job is queued with a
check_deferred event and the worker's failure is the submit-time error, word for word."""

from __future__ import annotations

import time

import pytest

from .conftest import TINY_MODEL, wait_for_status
from .test_api_inputs import assert_error, submit


def _accepted(client, auth, body) -> dict:
    response = submit(client, auth, body)
    assert response.status_code == 202, response.text
    job = response.json()
    client.post(f"/jobs/{job['id']}/cancel", headers=auth)  # not for the session's worker
    return job


def _events(client, auth, job_id: str) -> list[dict]:
    return client.get(f"/jobs/{job_id}/events", headers=auth).json()["data"]


@pytest.fixture(scope="module")
def tiny_tokenizer(service_settings):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(service_settings.resolved_models_dir / TINY_MODEL)


def test_terms_that_are_all_single_tokens_are_refused(client, auth, tiny_tokenizer):
    for word in ("network", "language"):  # whole words of the tiny model's FOLDOC-trained BPE
        assert len(tiny_tokenizer.encode(word, add_special_tokens=False)) == 1
        assert len(tiny_tokenizer.encode(" " + word, add_special_tokens=False)) == 1
    error = assert_error(submit(client, auth, {"base_model": TINY_MODEL, "terms": ["network"]}), 422, "terms[0]", "invalid_terms")
    assert "'network' is already one token" in error["message"] and "nothing to add" in error["message"]
    error = assert_error(submit(client, auth, {"base_model": TINY_MODEL, "terms": [" language ", "network"]}), 422, "terms[0]", "invalid_terms")
    assert "1 more term" in error["message"]


def test_one_term_worth_adding_is_enough(client, auth, tiny_tokenizer):
    assert len(tiny_tokenizer.encode("multiprogramming", add_special_tokens=False)) > 1
    job = _accepted(client, auth, {"base_model": TINY_MODEL, "terms": ["network", "multiprogramming"]})
    assert "check_deferred" not in {e["kind"] for e in _events(client, auth, job["id"])}


def test_builtin_model_terms_are_checked_with_its_tokenizer(client, auth, smollm2_path):
    # the report's own example
    error = assert_error(submit(client, auth, {"base_model": "smollm2-135m", "terms": ["the"]}), 422, "terms[0]", "invalid_terms")
    assert "'the' is already one token" in error["message"] and "smollm2-135m" in error["message"]


def _side_app(settings):
    """Another API on `settings`, with a key of its own: (app, TestClient, auth headers)."""
    from fastapi.testclient import TestClient

    from app.db.keys import create_key
    from app.main import create_app

    side = create_app(settings)
    with side.state.sessions() as session:
        headers = {"Authorization": f"Bearer {create_key(session, 'fresh-' + str(time.monotonic_ns()))[1]}"}
    return side, TestClient(side), headers


def test_a_new_server_checks_the_first_request_for_a_builtin(client, auth, service_settings, smollm2_path,
                                                             gemma3_tokenizer_path, tmp_path):
    """Issue 25, item 7: a data folder with no copy of SmolLM2's tokenizer. The API extracts the
    built-in tokenizers at start-up, so the very first `["the"]` is refused at submit, with the
    words of a server that had the tokenizer all along."""
    cache = tmp_path / "cache"
    (cache / "tokenizers").mkdir(parents=True)
    # Gemma's is not the one under test: given, so its extraction (the slower) does not compete
    (cache / "tokenizers" / "gemma3-270m").symlink_to(gemma3_tokenizer_path, target_is_directory=True)
    settings = service_settings.model_copy(update={"data_dir": tmp_path / "data", "cache_dir": cache, "queue": "tide-nobody-listens"})
    side, side_client, headers = _side_app(settings)
    body = {"base_model": "smollm2-135m", "terms": ["the"]}
    with side_client:  # the lifespan: start-up, then shutdown (which stops any extraction left)
        first = assert_error(submit(side_client, headers, body), 422, "terms[0]", "invalid_terms")
    assert (cache / "tokenizers" / "smollm2-135m" / "tokenizer.json").exists()
    assert not (cache / "builtin").exists()  # the tokenizer only: no weights converted
    assert first == assert_error(submit(client, auth, body), 422, "terms[0]", "invalid_terms")


def test_a_check_the_worker_makes_fails_with_the_submit_time_error(client, auth, service_settings, smollm2_path, worker, tmp_path):
    """Issue 25, item 7: where the API cannot have the tokenizer (here its extraction fails: its
    cache has a file where the tokenizers folder goes), the job is queued with a check_deferred
    event; the worker's failure is the error a submit-time check gives, word for word."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "tokenizers").write_text("not a folder")
    # The same database and queue as the session's worker (which has the model); another cache.
    side, side_client, headers = _side_app(service_settings.model_copy(update={"cache_dir": cache}))
    body = {"base_model": "smollm2-135m", "terms": ["the", "the"]}
    queued = submit(side_client, headers, body)
    assert queued.status_code == 202, queued.text
    job = queued.json()
    deferred = [e for e in _events(side_client, headers, job["id"]) if e["kind"] == "check_deferred"]
    assert len(deferred) == 1 and "the worker checks" in deferred[0]["payload"]["message"]

    at_submit = assert_error(submit(client, auth, body), 422, "terms[0]", "invalid_terms")
    done = wait_for_status(side_client, headers, job["id"], {"succeeded", "failed", "cancelled"}, 300, worker)
    assert done["status"] == "failed" and done["error"] == at_submit
    side.state.base_tokenizers.close()
    side.state.queue.close()


@pytest.mark.parametrize("term, named", [
    ("abc\u202edef", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("bidi\u2066isolate\u2069", "U+2066 LEFT-TO-RIGHT ISOLATE"),
    ("zero\u200bwidth", "U+200B ZERO WIDTH SPACE"),
    ("\ufeffbom", "U+FEFF ZERO WIDTH NO-BREAK SPACE"),
    ("word\u2060joiner", "U+2060 WORD JOINER"),
    # issue 25: what a probe got published as tokens ("pay\u200fload" displays as "payload")
    ("pay\u200fload", "U+200F RIGHT-TO-LEFT MARK"),
    ("\u200e", "U+200E LEFT-TO-RIGHT MARK"),
    ("ara\u061cbic", "U+061C ARABIC LETTER MARK"),
    ("\u00ad", "U+00AD SOFT HYPHEN"),
    ("\u2061", "U+2061 FUNCTION APPLICATION"),
    ("\U000e0041", "U+E0041 TAG LATIN CAPITAL LETTER A"),
    ("\ufe0f", "U+FE0F VARIATION SELECTOR-16"),
    ("\U000e0100", "U+E0100 VARIATION SELECTOR-17"),
    ("\u3164", "U+3164 HANGUL FILLER"),
    ("\u034f", "U+034F COMBINING GRAPHEME JOINER"),
    ("\u180e", "U+180E MONGOLIAN VOWEL SEPARATOR"),
    ("private\ue000use", "U+E000 (a private-use character"),
    ("un\u0378assigned", "U+0378 (an unassigned code point"),
])
def test_invisible_characters_in_terms_are_refused_with_the_reason(client, auth, term, named):
    error = assert_error(submit(client, auth, {"base_model": TINY_MODEL, "terms": ["multiprogramming", term]}), 422, "terms[1]", "invalid_terms")
    assert named in error["message"], error["message"]
    assert "remove it" in error["message"]


def test_a_jsonl_text_field_the_upload_lacks_is_refused(client, auth):
    lines = b'{"body": "first document about kernels"}\n{"body": "second one"}\n'
    stored = client.post("/files", files={"file": ("notes.jsonl", lines)}, data={"text_field": "body"}, headers=auth).json()
    body = {"base_model": TINY_MODEL, "corpus_file_id": stored["id"]}
    error = assert_error(submit(client, auth, body), 422, "corpus_text_field", "invalid_corpus")
    assert "'notes.jsonl'" in error["message"] and "'text'" in error["message"] and "line 1" in error["message"]
    assert stored["id"] + ".jsonl" not in error["message"]  # the client's name, not the server's
    _accepted(client, auth, {**body, "corpus_text_field": "body"})


def test_a_jsonl_field_missing_further_down_is_refused(client, auth):
    lines = b'{"text": "one", "title": "a"}\n{"text": "two", "title": "b"}\n{"title": "c"}\n'
    stored = client.post("/files", files={"file": ("mixed.jsonl", lines)}, data={"text_field": "title"}, headers=auth).json()
    body = {"base_model": TINY_MODEL, "corpus_file_id": stored["id"], "corpus_text_field": "text"}
    error = assert_error(submit(client, auth, body), 422, "corpus_text_field", "invalid_corpus")
    assert "line 3" in error["message"]


def test_a_term_given_in_nfc_and_nfd_is_added_once_and_the_merge_reported(client, auth, worker):
    """Issue 25, item 2: "caféology" composed and decomposed is one term (in NFC), and the job
    says it merged the two spellings."""
    composed, decomposed = "caf\u00e9ology", "cafe\u0301ology"
    body = {"base_model": TINY_MODEL, "terms": [composed, decomposed], "training": {"steps": 0}, "evaluation": {"max_bytes": 4000}}
    response = submit(client, auth, body)
    assert response.status_code == 202, response.text
    done = wait_for_status(client, auth, response.json()["id"], {"succeeded", "failed", "cancelled"}, 240, worker)
    assert done["status"] == "succeeded", done
    events = client.get(f"/jobs/{done['id']}/events", params={"limit": 1000}, headers=auth).json()["data"]
    extension = next(e["payload"] for e in events if e["kind"] == "extension")
    assert extension["counts"]["terms_added"] == 1
    assert [(s["term"], s["reason"]) for s in extension["skipped"]] == [(composed, "duplicate")]
    warnings = [e["payload"]["message"] for e in events if e["kind"] == "warning"]
    assert any("2 Unicode spellings" in w and "NFC" in w for w in warnings), warnings
