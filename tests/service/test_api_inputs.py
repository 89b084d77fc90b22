"""Bad input of every kind gets a 4xx in the one error shape, naming the field; auth and
ownership; idempotency; uploads; paging. No worker needed: jobs made here are cancelled while
still queued, or, where another file of this process has started the session's worker and it took
one, as soon as that worker sees the flag."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from .conftest import TINY_MODEL, foldoc_documents, wait_for_status


def assert_error(response, status: int, param: str | None, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "param"}, body
    assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body
    assert "Traceback" not in body["error"]["message"]
    assert len(body["error"]["message"]) > 15
    return body["error"]


def submit(client, auth, body, **headers):
    return client.post("/extend", json=body, headers={**auth, **headers})


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"base_model": "llama-9000", "terms": ["kernel"]}, "base_model", "model_not_found"),
        ({"base_model": "../models/tiny-llama", "terms": ["kernel"]}, "base_model", "model_not_found"),
        ({"base_model": "/etc/passwd", "terms": ["kernel"]}, "base_model", "model_not_found"),
        ({"base_model": "/work/main/.cache/builtin/smollm2-135m", "terms": ["kernel"]}, "base_model", "model_not_found"),
        ({"base_model": "", "terms": ["kernel"]}, "base_model", "invalid_request"),
        ({"base_model": TINY_MODEL, "terms": []}, "terms", "invalid_terms"),
        ({"base_model": TINY_MODEL, "terms": ["kernel", "   "]}, "terms[1]", "invalid_terms"),
        ({"base_model": TINY_MODEL, "terms": [""]}, "terms[0]", "invalid_terms"),
        ({"base_model": TINY_MODEL, "terms": ["x" * 65]}, "terms[0]", "invalid_terms"),
        ({"base_model": TINY_MODEL, "terms": ["ok", "bad\x00term"]}, "terms[1]", "invalid_terms"),
        ({"base_model": TINY_MODEL, "terms": [f"term{i}" for i in range(51)]}, "terms", "too_many_terms"),
        ({"base_model": TINY_MODEL}, "terms", "invalid_request"),
        ({"base_model": TINY_MODEL, "terms": "kernel"}, "terms", "invalid_request"),
        ({"base_model": TINY_MODEL, "terms": [1, 2]}, "terms[0]", "invalid_request"),
        ({"base_model": 7, "terms": ["kernel"]}, "base_model", "invalid_request"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "training": {"steps": "ten"}}, "training.steps", "invalid_option"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "training": {"steps": -1}}, "training.steps", "invalid_option"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "training": {"steps": 100_001}}, "training.steps", "invalid_option"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "training": {"lr": 0}}, "training.lr", "invalid_option"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "training": {"batch_size": 1.5}}, "training.batch_size", "invalid_option"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "training": "fast"}, "training", "invalid_request"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "trainnig": {}}, "trainnig", "invalid_request"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "evaluation": {"max_bytes": 10}}, "evaluation.max_bytes", "invalid_option"),
        ({"base_model": TINY_MODEL, "corpus_file_id": "file_doesnotexist"}, "corpus_file_id", "file_not_found"),
        ({"base_model": TINY_MODEL, "corpus_text": "a\n\nb", "corpus_file_id": "file_x"}, "corpus_text", "invalid_request"),
        ({"base_model": TINY_MODEL, "corpus_text": "   \n\n  "}, "corpus_text", "invalid_corpus"),
        ({"base_model": TINY_MODEL, "corpus_text": "x" * 200_001}, "corpus_text", "invalid_corpus"),
        ({"base_model": TINY_MODEL, "corpus_text": "a kernel", "examples": ["a kernel"]}, "examples", "invalid_request"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "corpus_text": "a kernel", "examples": ["a kernel"]}, "examples",
         "invalid_corpus"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "examples": ["a kernel", " "]}, "examples", "invalid_corpus"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "examples": "a kernel"}, "examples", "invalid_request"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "training": {"term_contexts": 0}}, "training.term_contexts",
         "invalid_option"),
        ({"base_model": TINY_MODEL, "terms": ["kernel"], "training": {"term_prompts": "english"}}, "training.term_prompts",
         "invalid_option"),
    ],
)
def test_bad_extend_requests_name_the_field(client, auth, body, param, code):
    assert_error(submit(client, auth, body), 422, param, code)


def test_unknown_model_lists_what_is_available(client, auth):
    error = assert_error(submit(client, auth, {"base_model": "llama-9000", "terms": ["kernel"]}), 422, "base_model")
    assert "smollm2-135m" in error["message"] and TINY_MODEL in error["message"]


def test_malformed_json_names_the_body(client, auth):
    response = client.post("/extend", content=b'{"base_model": "tiny-llama", "terms": [', headers={**auth, "Content-Type": "application/json"})
    error = assert_error(response, 422, "body", "malformed_json")
    assert "JSON" in error["message"]


@pytest.mark.parametrize("content", [b"", b"[]", b"null", b"42"])
def test_body_that_is_not_an_object(client, auth, content):
    response = client.post("/extend", content=content, headers={**auth, "Content-Type": "application/json"})
    assert_error(response, 422, "body")


def test_nan_is_not_a_learning_rate(client, auth):
    content = b'{"base_model": "tiny-llama", "terms": ["kernel"], "training": {"lr": NaN}}'
    response = client.post("/extend", content=content, headers={**auth, "Content-Type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"]["param"] in ("training.lr", "body")


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer tide_wrong"}, {"Authorization": "Basic dXNlcjpwdw=="}, {"Authorization": "Bearer"}])
def test_missing_or_wrong_key_is_401(client, headers):
    for method, path in [("get", "/jobs"), ("post", "/extend"), ("get", "/jobs/job_x"), ("post", "/files"), ("get", "/models")]:
        response = getattr(client, method)(path, headers=headers)
        assert_error(response, 401, "Authorization", "unauthorized")
        assert response.headers["www-authenticate"] == "Bearer"


def test_unknown_route_and_method_keep_the_error_shape(client, auth):
    assert_error(client.get("/nope", headers=auth), 404, None, "not_found")
    assert_error(client.put("/jobs", headers=auth), 405, None, "method_not_allowed")
    assert_error(client.get("/jobs/job_doesnotexist", headers=auth), 404, "job_id", "not_found")


def _queued_job(client, auth, **extra) -> dict:
    response = submit(client, auth, {"base_model": TINY_MODEL, "terms": ["multiprogramming"], "training": {"steps": 1}, **extra})
    assert response.status_code == 202, response.text
    return response.json()


def test_examples_and_the_context_options_reach_the_job(client, auth):
    """Issue 39: a terms-only request's `examples` and its contexts' options are stored with the job
    and given to the pipeline by the worker (worker.runner.build_spec, what a worker runs)."""
    from types import SimpleNamespace

    from app.settings import Settings
    from worker.runner import build_spec

    examples = ["Multiprogramming lets one processor run several programs.", "A second document."]
    job = _queued_job(client, auth, examples=examples, training={"steps": 1, "term_contexts": 7, "term_prompts": "term"})
    assert job["request"]["examples"] == examples
    spec = build_spec(SimpleNamespace(id=job["id"], request=job["request"]), None, Settings(data_dir=Path(os.devnull).parent))
    assert (spec.examples, spec.term_contexts, spec.term_prompts, spec.term_context_tokens) == (examples, 7, "term", None)
    client.post(f"/jobs/{job['id']}/cancel", headers=auth)


def test_submit_answers_202_with_location_and_cancel_while_queued(client, auth):
    response = submit(client, auth, {"base_model": TINY_MODEL, "terms": ["multiprogramming"], "training": {"steps": 1}})
    assert response.status_code == 202
    job = response.json()
    assert response.headers["location"] == f"/jobs/{job['id']}"
    assert job["status"] == "queued" and job["progress"] == {"step": 0, "total": 1, "percent": 0.0}
    assert job["request"]["mining"]["max_new_tokens"] == 300  # defaults filled in
    assert client.get(response.headers["location"], headers=auth).json()["id"] == job["id"]
    cancelled = client.post(f"/jobs/{job['id']}/cancel", headers=auth)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    # cancelling twice is harmless; artifacts of a cancelled job do not exist
    assert client.post(f"/jobs/{job['id']}/cancel", headers=auth).json()["status"] == "cancelled"
    assert_error(client.get(f"/jobs/{job['id']}/artifacts", headers=auth), 409, "job_id", "job_not_succeeded")
    kinds = [e["payload"].get("status") for e in client.get(f"/jobs/{job['id']}/events", headers=auth).json()["data"]]
    assert kinds == ["queued", "cancelled"]


def test_idempotency_key_returns_the_same_job(client, auth):
    body = {"base_model": TINY_MODEL, "terms": ["hypertext"], "training": {"steps": 1}}
    first = submit(client, auth, body, **{"Idempotency-Key": "retry-1"})
    second = submit(client, auth, body, **{"Idempotency-Key": "retry-1"})
    assert first.status_code == second.status_code == 202
    assert first.json()["id"] == second.json()["id"]
    assert second.headers["idempotent-replayed"] == "true"
    other = submit(client, auth, {**body, "terms": ["hyperlink"]}, **{"Idempotency-Key": "retry-1"})
    assert_error(other, 409, "Idempotency-Key", "idempotency_key_reused")
    client.post(f"/jobs/{first.json()['id']}/cancel", headers=auth)


def test_another_keys_job_is_404(client, auth, other_key):
    job = _queued_job(client, auth)
    other = {"Authorization": f"Bearer {other_key}"}
    for method, path in [("get", ""), ("get", "/events"), ("post", "/cancel"), ("delete", ""), ("get", "/artifacts"), ("get", "/archive")]:
        assert_error(getattr(client, method)(f"/jobs/{job['id']}{path}", headers=other), 404, "job_id", "not_found")
    assert job["id"] not in [j["id"] for j in client.get("/jobs?limit=100", headers=other).json()["data"]]
    client.post(f"/jobs/{job['id']}/cancel", headers=auth)
    assert client.get(f"/jobs/{job['id']}", headers=auth).json()["status"] == "cancelled"


def test_delete_refuses_active_and_removes_finished(client, auth, app):
    job = _queued_job(client, auth)
    assert_error(client.delete(f"/jobs/{job['id']}", headers=auth), 409, "job_id", "job_active")
    client.post(f"/jobs/{job['id']}/cancel", headers=auth)
    assert client.delete(f"/jobs/{job['id']}", headers=auth).status_code == 204
    assert_error(client.get(f"/jobs/{job['id']}", headers=auth), 404, "job_id")


def test_list_is_newest_first_and_pages(client, other_key, app):
    from app.db.keys import create_key

    with app.state.sessions() as session:
        key = create_key(session, "pager")[1]
    auth = {"Authorization": f"Bearer {key}"}
    ids = [_queued_job(client, auth)["id"] for _ in range(5)]
    for job_id in ids:
        assert client.post(f"/jobs/{job_id}/cancel", headers=auth).status_code == 200
    for job_id in ids:  # a live session worker may have taken one: it is "cancelling" until it looks
        wait_for_status(client, auth, job_id, {"cancelled"}, timeout=60)
    seen, cursor = [], None
    while True:
        page = client.get("/jobs", params={"limit": 2, **({"cursor": cursor} if cursor else {})}, headers=auth).json()
        seen += [j["id"] for j in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    assert_error(client.get("/jobs?cursor=abc", headers=auth), 422, "cursor")
    assert_error(client.get("/jobs?limit=0", headers=auth), 422, "limit")
    only = client.get("/jobs?status=cancelled", headers=auth).json()["data"]
    assert len(only) == 5


def test_events_after_only_returns_newer(client, auth):
    job = _queued_job(client, auth)
    client.post(f"/jobs/{job['id']}/cancel", headers=auth)
    events = client.get(f"/jobs/{job['id']}/events", headers=auth).json()
    assert len(events["data"]) == 2
    newer = client.get(f"/jobs/{job['id']}/events", params={"after": events["data"][0]["id"]}, headers=auth).json()
    assert [e["id"] for e in newer["data"]] == [events["data"][1]["id"]]
    assert newer["next_after"] == events["data"][1]["id"]
    assert_error(client.get(f"/jobs/{job['id']}/events?after=-1", headers=auth), 422, "after")


# -- uploads ---------------------------------------------------------------------------------

def test_upload_streams_hashes_and_counts_documents(client, auth):
    text = "\n\n".join(foldoc_documents(40)).encode("utf-8")
    response = client.post("/files", files={"file": ("foldoc.txt", text, "text/plain")}, headers=auth)
    assert response.status_code == 201, response.text
    stored = response.json()
    assert stored["bytes"] == len(text)
    assert stored["sha256"] == hashlib.sha256(text).hexdigest()
    assert stored["documents"] == 40
    assert client.get(f"/files/{stored['id']}", headers=auth).json() == stored


def test_upload_jsonl_with_text_field(client, auth):
    lines = b'{"body": "first document"}\n{"body": "second one"}\n'
    response = client.post("/files", files={"file": ("c.jsonl", lines)}, data={"text_field": "body"}, headers=auth)
    assert response.status_code == 201, response.text
    assert response.json()["documents"] == 2
    bad = client.post("/files", files={"file": ("c.jsonl", lines)}, headers=auth)
    error = assert_error(bad, 422, "file", "invalid_corpus")
    assert "'text'" in error["message"]


def test_upload_rejects_non_utf8(client, auth):
    latin1 = "Déjà vu, naïve café\n\nsecond document".encode("latin-1")
    error = assert_error(client.post("/files", files={"file": ("es.txt", latin1)}, headers=auth), 422, "file", "invalid_corpus")
    assert "UTF-8" in error["message"] and "offset" in error["message"]


def test_upload_rejects_binary_and_empty(client, auth):
    assert_error(client.post("/files", files={"file": ("x.bin", b"abc\x00def")}, headers=auth), 422, "file", "invalid_corpus")
    assert_error(client.post("/files", files={"file": ("e.txt", b"  \n\n \n")}, headers=auth), 422, "file", "invalid_corpus")


def test_a_corpus_of_only_control_characters_is_refused_at_upload(client, auth, service_settings):
    """Issue 25 item 8: valid UTF-8, every document non-blank, and not one character a term could
    be mined from: refused at upload (and inline), not minutes later at `mine`."""
    before = set(service_settings.resolved_uploads_dir.iterdir())
    invisible = "\x01\x02\x03\x7f\n\n\x04\u200b\u200e\n\n\x05\x06\u3164\n".encode("utf-8")
    error = assert_error(client.post("/files", files={"file": ("c.txt", invisible)}, headers=auth), 422, "file", "invalid_corpus")
    assert "no visible text" in error["message"] and "3 documents" in error["message"] and "U+0001" in error["message"]
    assert set(service_settings.resolved_uploads_dir.iterdir()) == before  # nothing kept
    jsonl = b'{"text": "\\u0001\\u0002"}\n{"text": "\\u0007"}\n'
    assert_error(client.post("/files", files={"file": ("c.jsonl", jsonl)}, headers=auth), 422, "file", "invalid_corpus")
    inline = client.post("/extend", json={"base_model": TINY_MODEL, "corpus_text": "\x01\x02\n\n\x03"}, headers=auth)
    assert "no visible text" in assert_error(inline, 422, "corpus_text", "invalid_corpus")["message"]
    # one visible character among the controls is text (emoji, punctuation and non-Latin scripts too)
    for text in ("\x01\x02\n\nß\x03", "\x01🙂", "\x01 — ", "\x01日本"):
        assert client.post("/files", files={"file": ("c.txt", text.encode())}, headers=auth).status_code == 201, text


def test_a_long_file_name_gets_an_error_naming_the_limit(client, auth, service_settings):
    """Issue 25 item 8: a 5,000-character file name was "malformed multipart body". The name is how
    GET /files shows the upload, so it is refused (never cut) with the limit; 255 is accepted as given."""
    before = set(service_settings.resolved_uploads_dir.iterdir())
    for name in ("x" * 4996 + ".txt", "é" * 300 + ".txt", "n" * 256):
        error = assert_error(client.post("/files", files={"file": (name, b"some text")}, headers=auth), 422, "file", "filename_too_long")
        assert f"has {len(name)} characters" in error["message"] and "limit is 255" in error["message"]
    assert set(service_settings.resolved_uploads_dir.iterdir()) == before
    longest = "c" * 249 + ".jsonl"
    stored = client.post("/files", files={"file": (longest, b'{"text": "a document"}\n')}, headers=auth)
    assert stored.status_code == 201 and stored.json()["filename"] == longest, stored.text


def test_upload_over_the_limit_is_413_and_leaves_nothing(client, auth, service_settings):
    big = b"word " * (service_settings.max_upload_bytes // 5 + 10)
    error = assert_error(client.post("/files", files={"file": ("big.txt", big)}, headers=auth), 413, "file", "file_too_large")
    assert str(service_settings.max_upload_bytes) in error["message"]

    def chunks():  # no Content-Length: the streaming parser must stop it on its own
        boundary = b"XyZ"
        yield b"--" + boundary + b'\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'
        for _ in range(service_settings.max_upload_bytes // 65536 + 4):
            yield b"a" * 65536
        yield b"\r\n--" + boundary + b"--\r\n"

    response = client.post("/files", content=chunks(), headers={**auth, "Content-Type": "multipart/form-data; boundary=XyZ"})
    assert_error(response, 413, "file", "file_too_large")
    leftovers = [p for p in service_settings.resolved_uploads_dir.iterdir() if p.name.endswith(".partial")]
    assert leftovers == []


def test_upload_needs_multipart_with_a_file_part(client, auth):
    assert_error(client.post("/files", content=b"hello", headers={**auth, "Content-Type": "text/plain"}), 415, "file")
    assert_error(client.post("/files", data={"other": "x"}, files={"note": ("n.txt", b"hi")}, headers=auth), 422, "file")


def test_anothers_upload_cannot_be_used(client, auth, other_key):
    stored = client.post("/files", files={"file": ("a.txt", b"some corpus text")}, headers=auth).json()
    other = {"Authorization": f"Bearer {other_key}"}
    assert_error(client.get(f"/files/{stored['id']}", headers=other), 404, "file_id")
    assert_error(submit(client, other, {"base_model": TINY_MODEL, "corpus_file_id": stored["id"]}), 422, "corpus_file_id", "file_not_found")


def test_models_lists_builtins_and_local(client, auth):
    names = {m["name"]: m["kind"] for m in client.get("/models", headers=auth).json()["data"]}
    assert names["smollm2-135m"] == "builtin" and names[TINY_MODEL] == "models_dir"


def test_healthz_needs_no_key(client):
    assert client.get("/healthz").json() == {"status": "ok"}


def test_body_that_is_not_utf8_is_malformed_json(client, auth):
    response = client.post("/extend", content=b'{"base_model": "\xff\xfe"}', headers={**auth, "Content-Type": "application/json"})
    assert_error(response, 422, "body", "malformed_json")


def _side_app(service_settings, tmp_path, **update):
    from app.main import create_app

    return create_app(service_settings.model_copy(update={"data_dir": tmp_path, "readyz_timeout_s": 0.3, **update}))


def test_readyz_names_what_is_missing(service_settings, tmp_path):
    from fastapi.testclient import TestClient

    lonely = _side_app(service_settings, tmp_path / "a", queue="tide-nobody-listens")
    error = assert_error(TestClient(lonely).get("/readyz"), 503, None, "not_ready")
    assert "no worker" in error["message"] and "tide-nobody-listens" in error["message"]
    unreachable = _side_app(service_settings, tmp_path / "b", redis_url="redis://127.0.0.1:1/0")
    error = assert_error(TestClient(unreachable).get("/readyz"), 503, None, "not_ready")
    assert "Redis" in error["message"]


def test_submit_while_redis_is_down_keeps_the_job_and_says_so(service_settings, tmp_path):
    from fastapi.testclient import TestClient

    from app.db.keys import create_key

    side = _side_app(service_settings, tmp_path, redis_url="redis://127.0.0.1:1/0")
    with side.state.sessions() as session:
        headers = {"Authorization": f"Bearer {create_key(session, 'x')[1]}"}
    client = TestClient(side)
    response = submit(client, headers, {"base_model": TINY_MODEL, "terms": ["multiprogramming"]})
    assert response.status_code == 202
    events = client.get(f"/jobs/{response.json()['id']}/events", headers=headers).json()["data"]
    assert [e["kind"] for e in events] == ["status", "warning"]
    assert "queue" in events[1]["payload"]["message"]
