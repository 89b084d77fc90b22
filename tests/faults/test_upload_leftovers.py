"""Issue 38 items 4 and 6: what a full uploads disk or an API killed mid-upload leaves behind.

Item 4: the uploads folder is a real tmpfs too small for the corpus, mounted for the server
process only (a private mount namespace), so the kernel answers the real write with ENOSPC.
Item 6: a real uvicorn is SIGKILLed while an upload streams in; the API started again on the same
data folder, its sweeper running, removes what the dead one left (the `.partial` file and the
bytes it had reserved of the key's quota) once it is older than the longest upload may take."""

from __future__ import annotations

import os
import shutil
import socket
import time

import httpx

from tests.service.served import served_api

from .conftest import TINY_MODEL, open_service


def _key(settings):
    from app.db.engine import init_db, make_engine, make_sessionmaker
    from app.db.keys import create_key

    engine = make_engine(settings.resolved_database_url)
    init_db(engine)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        return engine, sessions, create_key(session, "uploads")[1]


def _multipart(payload: bytes) -> bytes:
    return (b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="c.txt"\r\n\r\n' + payload + b"\r\n--XyZ--\r\n")


def _error(response: httpx.Response, status: int, code: str, param: str) -> dict:
    assert response.status_code == status, response.text[:500]
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "param"}, body
    assert body["error"]["code"] == code and body["error"]["param"] == param, body
    return body["error"]


def test_corpus_text_on_a_full_uploads_disk_is_507_and_leaves_nothing(fault_settings, tmp_path):
    """Before: 500, and a 0-byte uploads/file_<id>.txt that no row names and nothing sweeps.
    Now inline corpus_text is stored the way POST /files stores an upload (a partial file, the
    disk-full answer, the rename), so both answer the same 507 and keep nothing."""
    from app.db.models import Job, StoredFile

    settings = fault_settings.model_copy(update={"data_dir": tmp_path / "data"})
    uploads = settings.resolved_uploads_dir
    uploads.mkdir(parents=True)
    engine, sessions, key = _key(settings)
    mount = f"mount -t tmpfs -o size=64k tmpfs {uploads} && exec \"$@\""
    wrapper = [shutil.which("unshare"), "--user", "--map-root-user", "--mount", "sh", "-c", mount, "sh"]
    corpus = "hypertext documents link to other documents by hyperlinks\n\n" * 3000  # 180 kB
    auth = {"Authorization": f"Bearer {key}"}
    with served_api(settings, tmp_path / "uvicorn.log", wrapper=wrapper) as server:
        inside = f"/proc/{server.process.pid}/root{uploads}"
        with httpx.Client(base_url=f"http://{server.host}:{server.port}", timeout=60) as http:
            inline = _error(http.post("/extend", json={"base_model": TINY_MODEL, "corpus_text": corpus}, headers=auth),
                            507, "insufficient_storage", "corpus_text")
            assert "disk space" in inline["message"] and "nothing was kept" in inline["message"], inline
            assert os.listdir(inside) == []  # no empty file_<id>.txt, no partial
            uploaded = _error(http.post("/files", files={"file": ("c.txt", corpus.encode())}, headers=auth),
                              507, "insufficient_storage", "file")
            assert uploaded["message"] == inline["message"]  # one path stores both
            assert os.listdir(inside) == []
            # what fits is stored, and the job is queued
            small = http.post("/extend", json={"base_model": TINY_MODEL, "corpus_text": corpus[:20_000]}, headers=auth)
            assert small.status_code == 202, small.text
            assert [name.endswith(".txt") for name in os.listdir(inside)] == [True]
        assert "Traceback" not in server.log_tail(100_000), server.log_tail()
    with sessions() as session:
        assert [stored.bytes for stored in session.query(StoredFile).all()] == [20_000]
        assert session.query(Job).count() == 1
    engine.dispose()


def test_an_upload_left_by_a_killed_api_is_swept_and_its_quota_freed(fault_settings, tmp_path):
    """Before: a SIGKILL mid-upload left its `.file_*.partial` in uploads/ forever, through
    restarts and sweeps. Now the sweeper removes a partial file (and the bytes its upload had
    reserved of the key's quota) once nothing has written it for TIDE_MAX_UPLOAD_S, the longest
    an upload is let run; a younger one, perhaps still being written, stays."""
    from app.sweeper import SweepMemory, sweep

    settings = fault_settings.model_copy(update={
        "max_upload_s": 3.0, "max_upload_bytes": 8 * 1024 * 1024, "max_stored_bytes_per_key": 3_000_000,
    })
    engine, sessions, key = _key(settings)
    uploads = settings.resolved_uploads_dir
    body = _multipart(b"hypertext links documents\n\n" * 80_000)  # 2.2 MB
    with served_api(settings, tmp_path / "uvicorn.log") as server:
        head = (f"POST /files HTTP/1.1\r\nHost: tide\r\nAuthorization: Bearer {key}\r\n"
                f"Content-Type: multipart/form-data; boundary=XyZ\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        with socket.create_connection((server.host, server.port), timeout=30) as sock:
            sock.sendall(head + body[:1_000_000])  # the first megabyte, then the API dies
            deadline = time.monotonic() + 30
            while not any(p.stat().st_size > 500_000 for p in uploads.glob(".file_*.partial")):
                assert time.monotonic() < deadline, (list(uploads.iterdir()), server.log_tail())
                time.sleep(0.05)
            server.process.kill()
            server.process.wait(timeout=10)
    left = list(uploads.glob(".file_*.partial"))
    assert len(left) == 1, left

    with open_service(settings) as service:  # the API again, on the same folders, its sweeper running
        auth = {"Authorization": f"Bearer {key}"}
        deadline = time.monotonic() + 30
        while left[0].exists():
            assert time.monotonic() < deadline, f"{left[0].name} still in uploads/ after 30 s of sweeps"
            time.sleep(0.2)
        # the killed upload's reservation went with it: 2.2 MB fits under the 3 MB quota again
        stored = service.client.post("/files", content=body, headers={**auth, "Content-Type": "multipart/form-data; boundary=XyZ"})
        assert stored.status_code == 201, stored.text

    # a partial written recently (an upload in progress) stays; an old one goes. Swept here with
    # the service stopped: its own sweeper, running beside this one, could take the old partial first
    from app.queue import JobQueue

    fresh, old = uploads / ".file_fresh.partial", uploads / ".file_old.partial"
    fresh.write_bytes(b"x" * 10)
    old.write_bytes(b"x" * 10)
    os.utime(old, (time.time() - 10, time.time() - 10))
    counts = sweep(settings, sessions, JobQueue(settings), SweepMemory())
    assert fresh.exists() and not old.exists() and counts["partials_deleted"] == 1, counts
    engine.dispose()


def test_stopping_the_api_waits_for_the_sweep_in_progress(fault_settings, monkeypatch):
    """Before: shutdown cancelled the await on the sweep, and a sweep already in its thread ran on
    after the service had stopped, deleting files written after it (a flaky CI failure of the
    test above). Now shutdown lets that sweep finish and starts no other."""
    import threading

    from fastapi.testclient import TestClient

    import app.main

    started, finished = threading.Event(), threading.Event()

    def slow_sweep(*args):
        started.set()
        time.sleep(1.0)
        finished.set()
        return {}

    monkeypatch.setattr(app.main, "sweep", slow_sweep)
    with TestClient(app.main.create_app(fault_settings)):
        assert started.wait(30), "the sweeper did not start"
    assert finished.is_set(), "the service stopped with a sweep still running in its thread"
