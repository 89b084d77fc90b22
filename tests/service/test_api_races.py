"""Issue 25, items 1, 6 and 8 (downloads): requests that race each other on one job, and what a
download client is told, against a real uvicorn serving the app with a real SQLite file.

No worker listens on this module's queue, so submitted jobs stay queued; a "published" job is
made the way the worker makes one (claim, model folder, archive size and sha256, finish), with
files of its own so that the archive is large."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta

import pytest

from .conftest import TINY_MODEL, _queue_keys_cleanup
from .served import served_api


@dataclass
class Api:
    server: object
    settings: object
    sessions: object
    key: str

    def call(self, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> tuple[int, dict, bytes]:
        connection = http.client.HTTPConnection(self.server.host, self.server.port, timeout=60)
        try:
            data = json.dumps(body).encode() if body is not None else None
            connection.request(method, path, body=data, headers={
                "Authorization": f"Bearer {self.key}", "Content-Type": "application/json", **(headers or {})})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        finally:
            connection.close()

    def queued_job(self) -> str:
        status, _, body = self.call("POST", "/extend", {"base_model": TINY_MODEL, "terms": ["multiprogramming"], "training": {"steps": 1}})
        assert status == 202, body
        return json.loads(body)["id"]


@pytest.fixture(scope="module")
def api(service_settings, tmp_path_factory):
    from app.db.engine import init_db, make_engine, make_sessionmaker
    from app.db.keys import create_key

    data_dir = tmp_path_factory.mktemp("races")
    settings = service_settings.model_copy(update={"data_dir": data_dir, "queue": f"tide-races-{uuid.uuid4().hex[:8]}"})
    engine = make_engine(settings.resolved_database_url)
    init_db(engine)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        key = create_key(session, "races")[1]
    try:
        with served_api(settings, data_dir / "uvicorn.log") as server:
            yield Api(server, settings, sessions, key)
            assert "Traceback" not in server.log_tail(200_000), server.log_tail()
    finally:
        engine.dispose()
        _queue_keys_cleanup(settings)


# -- item 1: cancel and delete racing on one queued job ---------------------------------------

ROUNDS = 30


def test_parallel_cancels_and_deletes_of_a_queued_job_never_500_and_delete_it_once(api):
    """Three cancels and three deletes at once, many times. A DELETE that comes before any cancel
    is told 409 (docs/service.md: an active job is not deleted; cancel it first) and, as a client
    would, tries again: of the deletes exactly one gets 204, the others 404. A cancel answers 200
    with the job cancelled, or 404 once the job is gone; never a 500."""
    for round_ in range(ROUNDS):
        job_id = api.queued_job()
        start = threading.Barrier(6)

        def cancel() -> list[tuple[int, bytes]]:
            start.wait()
            status, _, body = api.call("POST", f"/jobs/{job_id}/cancel")
            return [(status, body)]

        def delete() -> list[tuple[int, bytes]]:
            start.wait()
            answers = []
            for _ in range(200):
                status, _, body = api.call("DELETE", f"/jobs/{job_id}")
                answers.append((status, body))
                if status != 409:
                    break
                time.sleep(0.005)
            return answers

        with ThreadPoolExecutor(6) as pool:
            cancels = [pool.submit(cancel) for _ in range(3)]
            deletes = [pool.submit(delete) for _ in range(3)]
            cancel_answers = [a for f in cancels for a in f.result()]
            delete_runs = [f.result() for f in deletes]
        everything = cancel_answers + [a for run in delete_runs for a in run]
        assert all(status < 500 for status, _ in everything), (round_, everything)
        for status, body in cancel_answers:
            assert status in (200, 404), (round_, status, body)
            if status == 200:
                assert json.loads(body)["status"] == "cancelled", (round_, body)
            else:
                assert json.loads(body)["error"]["code"] == "not_found", (round_, body)
        for run in delete_runs:
            for status, body in run[:-1]:
                assert json.loads(body)["error"]["code"] == "job_active" and "queued" in json.loads(body)["error"]["message"]
        finals = sorted(run[-1][0] for run in delete_runs)
        assert finals == [204, 404, 404], (round_, delete_runs)
        assert api.call("GET", f"/jobs/{job_id}")[0] == 404


# -- a published job with a large archive -----------------------------------------------------

BIG = 64 * 1024 * 1024  # far more than the socket buffers hold, so the server is mid-file when the DELETE comes


def _publish(api: Api) -> dict:
    """Claim a queued job and finish it as the worker does, with a model folder of our own: a
    small file before and after a large one (the archive sends them in path order)."""
    from sqlalchemy import select

    from app.db import jobs as job_state
    from app.db.models import Job, utcnow
    from app.storage import job_archive, model_dir

    job_id = api.queued_job()
    claim, reason = job_state.claim(api.sessions, job_id, worker="test", lease_s=600, max_attempts=3)
    assert claim is not None, reason
    folder = model_dir(api.settings, job_id)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "job": job_id}))
    with (folder / "model.safetensors").open("wb") as big:  # sparse in the middle: no 64 MB written
        big.write(os.urandom(1 << 20))
        big.seek(BIG - (1 << 20))
        big.write(os.urandom(1 << 20))
    (folder / "tokenizer.json").write_bytes(os.urandom(300_000))
    manifest = [
        {"path": p.name, "size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
        for p in sorted(folder.iterdir())
    ]
    with api.sessions() as db:
        created_at = db.scalar(select(Job.created_at).where(Job.id == job_id))
    archive = job_archive(api.settings, job_id, created_at)
    sha = archive.sha256()
    assert job_state.finish_owned(api.sessions, claim, "succeeded", expires_at=utcnow() + timedelta(hours=1),
                                  manifest=manifest, archive_bytes=archive.size, archive_sha256=sha)
    return {"id": job_id, "size": archive.size, "sha256": sha, "files": {f["path"]: f for f in manifest}}


def _slow_download_with_a_delete_in_the_middle(api: Api, job: dict, path: str) -> tuple[int, int, int, str, int]:
    """GET `path`, read 1 MiB slowly, DELETE the job from another connection, then read the rest.
    Returns (status, Content-Length, bytes received, their sha256, the DELETE's status)."""
    connection = http.client.HTTPConnection(api.server.host, api.server.port, timeout=60)
    try:
        connection.request("GET", path, headers={"Authorization": f"Bearer {api.key}"})
        response = connection.getresponse()
        length = int(response.getheader("content-length"))
        digest = hashlib.sha256()
        received = 0
        for _ in range(16):  # a slow reader: 64 KiB every 20 ms
            chunk = response.read(65536)
            digest.update(chunk)
            received += len(chunk)
            time.sleep(0.02)
        deleted = api.call("DELETE", f"/jobs/{job['id']}")[0]
        assert not (api.settings.resolved_artifacts_dir / job["id"]).exists(), "the DELETE left the files on disk"
        try:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                received += len(chunk)
        except http.client.IncompleteRead as short:  # the connection ended before Content-Length bytes
            digest.update(short.partial)
            received += len(short.partial)
        return response.status, length, received, digest.hexdigest(), deleted
    finally:
        connection.close()


def test_deleting_a_job_while_its_archive_downloads_lets_the_download_finish(api):
    """Item 6: the open files outlive the DELETE; the client gets every byte the 200 announced."""
    job = _publish(api)
    status, length, received, sha, deleted = _slow_download_with_a_delete_in_the_middle(api, job, f"/jobs/{job['id']}/archive")
    assert deleted == 204
    assert (status, length) == (200, job["size"])
    assert received == job["size"] and sha == job["sha256"], f"a 200 cut short: {received} of {job['size']} bytes"
    # and the job is gone for everyone after
    assert api.call("GET", f"/jobs/{job['id']}/archive")[0] == 404


def test_deleting_a_job_while_one_of_its_files_downloads_lets_the_download_finish(api):
    job = _publish(api)
    big = job["files"]["model.safetensors"]
    status, length, received, sha, deleted = _slow_download_with_a_delete_in_the_middle(
        api, job, f"/jobs/{job['id']}/artifacts/model.safetensors")
    assert deleted == 204
    assert (status, length, received, sha) == (200, big["size"], big["size"], big["sha256"])


def test_a_download_whose_files_went_missing_since_the_job_was_read_is_a_clean_error(api):
    """The files of a job that is still published are gone (damage, not a delete): 500 in the
    error shape before any byte is sent, never a 200 that stops short."""
    import shutil

    from app.storage import model_dir

    job = _publish(api)
    shutil.rmtree(model_dir(api.settings, job["id"]))
    for path in (f"/jobs/{job['id']}/archive", f"/jobs/{job['id']}/artifacts/config.json"):
        status, headers, body = api.call("GET", path)
        assert status == 500 and json.loads(body)["error"]["code"] == "artifacts_damaged", (path, status, body[:300])
        assert str(api.settings.data_dir) not in body.decode()
    assert api.call("DELETE", f"/jobs/{job['id']}")[0] == 204


# -- item 8: HEAD and an unparseable Range ----------------------------------------------------

def test_head_on_a_download_answers_its_headers_without_the_body(api):
    job = _publish(api)
    archive = f"/jobs/{job['id']}/archive"
    for path, size, etag in ((archive, job["size"], f'"{job["sha256"]}"'),
                             (f"/jobs/{job['id']}/artifacts/tokenizer.json", job["files"]["tokenizer.json"]["size"], None)):
        status, headers, body = api.call("HEAD", path)
        assert status == 200 and body == b"", (path, status, body[:200])
        assert int(headers["content-length"]) == size and headers["accept-ranges"] == "bytes", headers
        _, get_headers, _ = api.call("GET", path, headers={"Range": "bytes=0-0"})
        assert headers["etag"] == get_headers["etag"] and headers["last-modified"] == get_headers["last-modified"]
        if etag:
            assert headers["etag"] == etag
        status, headers, body = api.call("HEAD", path, headers={"Range": "bytes=10-19"})
        assert status == 206 and body == b"" and headers["content-range"] == f"bytes 10-19/{size}", (status, headers)
    # the errors of HEAD are the errors of GET
    assert api.call("HEAD", f"/jobs/job_{'0' * 32}/archive")[0] == 404
    assert api.call("HEAD", f"/jobs/{job['id']}/artifacts/nothing.bin")[0] == 404


@pytest.mark.parametrize("header", ["bytes=--5", "bytes=-", "bytes=1-2-3", "bytes=0-1,x", "bytes=+5-10", "bytes=1_0-20"])
def test_an_unparseable_range_is_ignored_on_every_download(api, header):
    """docs/service.md: a Range that cannot be parsed is ignored, the whole file sent with 200."""
    job = _publish_once(api)
    for path, size in ((f"/jobs/{job['id']}/archive", job["size"]),
                       (f"/jobs/{job['id']}/artifacts/config.json", job["files"]["config.json"]["size"])):
        status, headers, body = api.call("GET", path, headers={"Range": header})
        assert (status, len(body), int(headers["content-length"])) == (200, size, size), (header, path, status, body[:200])


_PUBLISHED: dict[str, dict] = {}


def _publish_once(api: Api) -> dict:
    if "job" not in _PUBLISHED:
        _PUBLISHED["job"] = _publish(api)
    return _PUBLISHED["job"]
