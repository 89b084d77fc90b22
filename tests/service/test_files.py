"""Issue 25 item 4: a key lists its stored corpora (GET /files) and deletes them (DELETE
/files/{id}), through each door: HTTP, app.client and `tide jobs`. A real uvicorn, SQLite, Redis;
no worker consumes this server's queue, so a job stays queued and keeps its corpus in use."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import REPO

from .conftest import TINY_MODEL
from .served import served_api
from .test_api_inputs import assert_error

CORPUS = ("a document about hypertext and hyperlinks\n\n" * 48).encode()[:2000]
QUOTA = 6000  # three 2,000-byte corpora fit under it, a fourth does not


@pytest.fixture(scope="module")
def server(service_settings, tmp_path_factory):
    from app.db.engine import init_db, make_engine, make_sessionmaker

    folder = tmp_path_factory.mktemp("files")
    settings = service_settings.model_copy(update={
        "data_dir": folder, "queue": f"tide-files-{uuid.uuid4().hex[:8]}", "max_stored_bytes_per_key": QUOTA,
    })
    engine = make_engine(settings.resolved_database_url)
    init_db(engine)
    with served_api(settings, folder / "uvicorn.log") as running:
        running.sessions = make_sessionmaker(engine)
        running.settings = settings
        running.url = f"http://{running.host}:{running.port}"
        yield running
    engine.dispose()


def _new_key(server, name: str) -> str:
    from app.db.keys import create_key

    with server.sessions() as session:
        return create_key(session, name)[1]


def _on_disk(server) -> set[str]:
    return {path.name for path in server.settings.resolved_uploads_dir.iterdir()}


def test_files_are_listed_with_their_jobs_and_deleted_over_http(server):
    auth = {"Authorization": f"Bearer {_new_key(server, 'http')}"}
    other = {"Authorization": f"Bearer {_new_key(server, 'other')}"}
    with httpx.Client(base_url=server.url, timeout=30) as http:
        first = http.post("/files", files={"file": ("first.txt", CORPUS)}, headers=auth).json()
        job = http.post("/extend", json={"base_model": TINY_MODEL, "corpus_file_id": first["id"]}, headers=auth)
        assert job.status_code == 202, job.text
        job = job.json()
        second = http.post("/files", files={"file": ("second.txt", CORPUS)}, headers=auth).json()
        assert second["jobs"] == [] and second["source"] == "upload"

        listed = http.get("/files", headers=auth).json()
        assert [f["id"] for f in listed["data"]] == [second["id"], first["id"]] and listed["next_cursor"] is None
        assert listed["data"][1]["jobs"] == [{"id": job["id"], "status": "queued"}]
        assert listed["data"][1]["bytes"] == 2000 and listed["data"][1]["filename"] == "first.txt"
        assert http.get("/files", headers=other).json()["data"] == []
        page = http.get("/files", params={"limit": 1}, headers=auth).json()
        assert [f["id"] for f in page["data"]] == [second["id"]]
        rest = http.get("/files", params={"limit": 1, "cursor": page["next_cursor"]}, headers=auth).json()
        assert [f["id"] for f in rest["data"]] == [first["id"]] and rest["next_cursor"] is None
        assert_error(http.get("/files", params={"cursor": "file_nope"}, headers=auth), 422, "cursor", "invalid_request")

        # 4,000 bytes kept of 6,000: a third corpus fits exactly; a fourth would pass the limit
        assert http.post("/files", files={"file": ("third.txt", CORPUS)}, headers=auth).status_code == 201
        full = http.post("/files", files={"file": ("fourth.txt", CORPUS)}, headers=auth)
        assert_error(full, 507, None, "storage_quota_exceeded")
        assert "DELETE /files/{id}" in full.json()["error"]["message"]

        # a queued job's corpus stays: 409 naming the job, the bytes still there
        busy = assert_error(http.delete(f"/files/{first['id']}", headers=auth), 409, "file_id", "file_in_use")
        assert job["id"] in busy["message"] and "queued" in busy["message"] and "cancel" in busy["message"]
        assert any(name.startswith(first["id"]) for name in _on_disk(server))

        # another key's file, or no file at all: 404, and nothing deleted
        assert_error(http.delete(f"/files/{second['id']}", headers=other), 404, "file_id", "not_found")
        assert_error(http.delete("/files/file_0123456789abcdef0123456789abcdef", headers=auth), 404, "file_id", "not_found")
        assert http.get(f"/files/{second['id']}", headers=auth).status_code == 200

        # deleted: 204, its bytes gone from the disk and from the quota (the fourth now fits)
        assert http.delete(f"/files/{second['id']}", headers=auth).status_code == 204
        assert not any(name.startswith(second["id"]) for name in _on_disk(server))
        assert_error(http.get(f"/files/{second['id']}", headers=auth), 404, "file_id", "not_found")
        assert_error(http.delete(f"/files/{second['id']}", headers=auth), 404, "file_id", "not_found")
        assert http.post("/files", files={"file": ("fourth.txt", CORPUS)}, headers=auth).status_code == 201

        # once its job has ended, the corpus can go; the job stays readable
        assert http.post(f"/jobs/{job['id']}/cancel", headers=auth).json()["status"] == "cancelled"
        assert http.get(f"/files/{first['id']}", headers=auth).json()["jobs"] == [{"id": job["id"], "status": "cancelled"}]
        assert http.delete(f"/files/{first['id']}", headers=auth).status_code == 204
        assert not any(name.startswith(first["id"]) for name in _on_disk(server))
        assert http.get(f"/jobs/{job['id']}", headers=auth).json()["status"] == "cancelled"
        assert http.delete(f"/jobs/{job['id']}", headers=auth).status_code == 204


def test_files_through_the_python_client(server, tmp_path):
    from app.client import ClientError, TideClient

    corpus = tmp_path / "client.txt"
    corpus.write_bytes(CORPUS)
    with TideClient(server.url, _new_key(server, "client")) as tide:
        job = tide.submit(TINY_MODEL, corpus=corpus)
        spare = tide.upload(corpus)
        files = tide.files(limit=1)  # every page
        assert [f["id"] for f in files] == [spare["id"], job["request"]["corpus_file_id"]]
        assert files[1]["jobs"] == [{"id": job["id"], "status": "queued"}]
        with pytest.raises(ClientError) as caught:
            tide.delete_file(files[1]["id"])
        assert caught.value.status == 409 and caught.value.code == "file_in_use" and job["id"] in caught.value.message
        tide.delete_file(spare["id"])
        assert [f["id"] for f in tide.files()] == [files[1]["id"]]
        with pytest.raises(ClientError) as caught:
            tide.delete_file(spare["id"])
        assert caught.value.status == 404 and caught.value.param == "file_id"
        tide.cancel(job["id"])
        tide.delete_file(files[1]["id"])
        assert tide.files() == []


def _tide(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).with_name("tide")), "jobs", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )


def test_files_through_the_command_line(server, tmp_path):
    from app.client import TideClient

    key = _new_key(server, "cli")
    env = {**os.environ, "TIDE_URL": server.url, "TIDE_API_KEY": key, "PYTHONPATH": os.environ.get("PYTHONPATH", str(REPO))}
    corpus = tmp_path / "cli-corpus.txt"
    corpus.write_bytes(CORPUS)
    submitted = _tide(["submit", "--base-model", TINY_MODEL, "--corpus", str(corpus)], env, tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    with TideClient(server.url, key) as tide:
        file_id = tide.job(job_id)["request"]["corpus_file_id"]

    listed = _tide(["files"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if line.startswith(file_id))
    assert "2,000" in row and f"{job_id} (queued)" in row and row.endswith("cli-corpus.txt")

    busy = _tide(["delete-file", file_id], env, tmp_path)
    assert busy.returncode == 2 and "(file_id)" in busy.stderr and job_id in busy.stderr, busy.stderr
    assert _tide(["cancel", job_id], env, tmp_path).returncode == 0
    deleted = _tide(["delete-file", file_id], env, tmp_path)
    assert deleted.returncode == 0 and deleted.stdout.strip() == f"{file_id} deleted", deleted.stderr
    assert file_id not in _tide(["files"], env, tmp_path).stdout
    again = _tide(["delete-file", file_id], env, tmp_path)
    assert again.returncode == 2 and "no file" in again.stderr


def test_a_corpus_deleted_while_a_job_is_submitted_on_it_is_never_half_used(server):
    """DELETE /files/{id} racing POST /extend on the same file: either the job gets the file (202,
    the delete 409) or the delete wins (204, the submit 422); never a 5xx, never a job whose
    corpus is gone."""
    from concurrent.futures import ThreadPoolExecutor

    auth = {"Authorization": f"Bearer {_new_key(server, 'race')}"}
    outcomes = set()
    with httpx.Client(base_url=server.url, timeout=30) as http, ThreadPoolExecutor(4) as pool:
        for _round in range(25):
            stored = http.post("/files", files={"file": ("race.txt", CORPUS)}, headers=auth).json()
            submit = pool.submit(http.post, "/extend", json={"base_model": TINY_MODEL, "corpus_file_id": stored["id"]}, headers=auth)
            delete = pool.submit(http.delete, f"/files/{stored['id']}", headers=auth)
            submitted, deleted = submit.result(), delete.result()
            outcome = (submitted.status_code, deleted.status_code)
            assert outcome in {(202, 409), (422, 204)}, (outcome, submitted.text, deleted.text)
            outcomes.add(outcome)
            if submitted.status_code == 202:
                job = submitted.json()["id"]
                assert http.get(f"/files/{stored['id']}", headers=auth).json()["jobs"][0]["id"] == job
                http.post(f"/jobs/{job}/cancel", headers=auth)
                http.delete(f"/jobs/{job}", headers=auth)
                assert http.delete(f"/files/{stored['id']}", headers=auth).status_code == 204
