"""Issue 38 items 1 and 3: a key's limits hold under parallel clients.

A real uvicorn serves the API (its thread pool runs the requests at once), with a real SQLite
file or a real PostgreSQL cluster of the test's own (tests/faults/postgres.py); the clients are
threads released together by a barrier, and the test counts what got through: answers, and the
rows and bytes the server kept."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.service.served import served_api

from .conftest import TINY_MODEL
from .postgres import postgres_cluster  # noqa: F401  (a fixture)

BODY = {"base_model": TINY_MODEL, "terms": ["hypertext"]}


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request) -> str | None:
    if request.param == "sqlite":
        return None  # the default: a SQLite file in the data folder
    return request.getfixturevalue("postgres_cluster").new_database()


def _served(settings, log_path):
    """The database made and a key created the way `tide keys create` does, then the API served."""
    from app.db.engine import init_db, make_engine, make_sessionmaker
    from app.db.keys import create_key

    engine = make_engine(settings.resolved_database_url)
    init_db(engine)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        key = create_key(session, "parallel")[1]
    return engine, sessions, key, served_api(settings, log_path)


def _at_once(count: int, call) -> list:
    """`count` calls from as many threads, released together."""
    barrier = threading.Barrier(count)

    def one(index: int):
        barrier.wait(timeout=60)
        return call(index)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def _in_flight(sessions) -> int:
    from sqlalchemy import func, select

    from app.db.models import Job
    from app.quotas import IN_FLIGHT

    with sessions() as session:
        return session.scalar(select(func.count()).select_from(Job).where(Job.status.in_(IN_FLIGHT)))


def test_parallel_submits_never_pass_the_active_job_limit(fault_settings, database_url, tmp_path):
    """Item 1: the count and the insert were two steps, so 20 parallel submits all got 202 (limit
    4). Now the key's row is locked first (SELECT ... FOR NO KEY UPDATE on PostgreSQL, the write
    lock on SQLite), and each burst lets exactly as many through as the limit has room for."""
    limit = 4
    settings = fault_settings.model_copy(update={"max_active_jobs_per_key": limit, "database_url": database_url})
    engine, sessions, key, serving = _served(settings, tmp_path / "uvicorn.log")
    auth = {"Authorization": f"Bearer {key}"}
    with serving as server, httpx.Client(base_url=f"http://{server.host}:{server.port}", timeout=60,
                                         limits=httpx.Limits(max_connections=40)) as http:
        def submit(_index: int) -> httpx.Response:
            return http.post("/extend", json=BODY, headers=auth)

        # one submit first, alone: the API's first request loads the tiny model's tokenizer
        warm = submit(0)
        assert warm.status_code == 202, warm.text
        assert http.post(f"/jobs/{warm.json()['id']}/cancel", headers=auth).status_code == 200

        through = []
        for active_before, clients in ((0, 20), (3, 12), (0, 12), (2, 16)):
            for job in http.get("/jobs", params={"limit": 100, "status": "queued"}, headers=auth).json()["data"]:
                assert http.post(f"/jobs/{job['id']}/cancel", headers=auth).status_code == 200
            for _ in range(active_before):
                assert submit(0).status_code == 202
            answers = _at_once(clients, submit)
            statuses = sorted(answer.status_code for answer in answers)
            accepted = statuses.count(202)
            through.append(accepted)
            assert set(statuses) <= {202, 429}, [answer.text[:300] for answer in answers if answer.status_code not in (202, 429)]
            for answer in answers:
                if answer.status_code == 429:
                    error = answer.json()["error"]
                    assert error["code"] == "too_many_active_jobs" and f"limit is {limit}" in error["message"], error
            assert _in_flight(sessions) == limit, (active_before, clients, statuses)
        # exactly the room each burst had: 4 of 20, 1 of 12 with 3 active, 4 of 12, 2 of 16
        assert through == [4, 1, 4, 2], through
        assert "Traceback" not in server.log_tail(200_000), server.log_tail()
    engine.dispose()


def _multipart(payload: bytes, boundary: str = "XyZ") -> bytes:
    return (f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="c.txt"\r\n\r\n'.encode()
            + payload + f"\r\n--{boundary}--\r\n".encode())


def _stored(sessions) -> list[int]:
    from app.db.models import StoredFile

    with sessions() as session:
        return [stored.bytes for stored in session.query(StoredFile).all()]


def test_parallel_uploads_never_pass_the_storage_quota(fault_settings, tmp_path):
    """Item 3: the quota was checked once before the upload, so at 9.9 MB of 10 MB a 60 MB upload
    was stored, and 10 parallel 5 MB uploads from empty all got 201. Now an upload reserves its
    bytes before it writes them (its declared size at its first byte, a body sent chunked one piece
    at a time) and in-progress uploads count: the key's kept bytes never pass the quota."""
    quota, size = 1_000_000, 300_000
    settings = fault_settings.model_copy(update={"max_stored_bytes_per_key": quota, "max_upload_bytes": 4 * 1024 * 1024})
    engine, sessions, key, serving = _served(settings, tmp_path / "uvicorn.log")
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "multipart/form-data; boundary=XyZ"}
    payload = (b"hypertext links documents together\n\n" * (size // 30))[:size]

    def pieces(body: bytes):
        for start in range(0, len(body), 16 * 1024):
            yield body[start:start + 16 * 1024]

    with serving as server, httpx.Client(base_url=f"http://{server.host}:{server.port}", timeout=120) as http:
        def upload(index: int) -> httpx.Response:
            body = _multipart(payload)
            # half the clients announce their size, half send the body chunked (no size known up front)
            return http.post("/files", content=body if index % 2 else pieces(body), headers=auth)

        for round_ in range(3):
            answers = _at_once(10, upload)
            statuses = [answer.status_code for answer in answers]
            assert set(statuses) <= {201, 507}, [answer.text[:300] for answer in answers]
            for answer in answers:
                if answer.status_code == 507:
                    assert answer.json()["error"]["code"] == "storage_quota_exceeded", answer.text
            kept = _stored(sessions)
            assert sum(kept) <= quota, (round_, statuses, kept)  # 10 x 300 kB were all stored before
            assert 1 <= statuses.count(201) <= quota // size and len(kept) == statuses.count(201), statuses
            for stored in http.get("/files", headers=auth).json()["data"]:
                assert http.delete(f"/files/{stored['id']}", headers=auth).status_code == 204

        # one at a time: at 900 kB of 1 MB kept, a 2 MB upload is refused and nothing of it is kept
        first = http.post("/files", content=_multipart(payload * 3), headers=auth)
        assert first.status_code == 201, first.text
        for body in (_multipart(payload * 7), pieces(_multipart(payload * 7))):
            refused = http.post("/files", content=body, headers=auth)
            assert refused.status_code == 507, refused.text
            error = refused.json()["error"]
            assert error["code"] == "storage_quota_exceeded" and "900.0 kB" in error["message"] and "1.0 MB" in error["message"], error
        assert _stored(sessions) == [3 * size]
        assert [p.name for p in settings.resolved_uploads_dir.iterdir() if p.name.endswith(".partial")] == []
        assert "Traceback" not in server.log_tail(200_000), server.log_tail()
    engine.dispose()
