"""Hostile and broken clients against a real uvicorn server (raw sockets) and the in-process
API: oversized and anonymous bodies, stalled bodies, cut-off uploads, a full disk, bad cursors.
Each answer is a 4xx/5xx in the one error shape, and nothing is left half-stored."""

from __future__ import annotations

import itertools
import shutil
import subprocess
import time

import pytest

from .conftest import TINY_MODEL
from .served import request, served_api
from .test_api_inputs import assert_error

BIG = 200_000_000  # the 200 MB body of the report


def _head(method: str, path: str, *, key: str | None = None, length: int | None = None, chunked: bool = False,
          content_type: str = "application/json") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: tide", f"Content-Type: {content_type}"]
    if key:
        lines.append(f"Authorization: Bearer {key}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _error(answer, status: int, param: str | None, code: str) -> dict:
    assert answer.status == status, (answer.status, answer.body[:300])
    body = answer.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "param"}, body
    assert body["error"]["code"] == code and body["error"]["param"] == param, body
    return body["error"]


@pytest.fixture(scope="module")
def server(service_settings, api_key, tmp_path_factory):
    settings = service_settings.model_copy(update={"max_request_body_bytes": 64 * 1024, "request_body_timeout_s": 1.0})
    with served_api(settings, tmp_path_factory.mktemp("served") / "uvicorn.log") as running:
        yield running


# -- item 3: the key before the body, and a cap on the body ---------------------------------

def test_anonymous_200mb_body_is_refused_before_it_is_read(server):
    # Only the headers are sent: the 401 comes although not one byte of the body has.
    for key in (None, "tide_not-a-key"):
        answer = request(server, _head("POST", "/extend", key=key, length=BIG))
        error = _error(answer, 401, "Authorization", "unauthorized")
        assert "key" in error["message"] and answer.headers["www-authenticate"] == "Bearer"
        assert answer.closed, "the server must close the connection instead of reading 200 MB"


def test_authenticated_body_over_the_limit_is_413(server, api_key):
    declared = request(server, _head("POST", "/extend", key=api_key, length=BIG))
    error = _error(declared, 413, "body", "payload_too_large")
    assert str(64 * 1024) in error["message"] and "TIDE_MAX_REQUEST_BODY_BYTES" in error["message"]
    assert declared.closed

    # Chunked, no Content-Length: counted as it streams, refused once past the limit.
    chunk = b"a" * 16384
    chunks = (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(10_000))
    streamed = request(server, _head("POST", "/extend", key=api_key, chunked=True), chunks)
    _error(streamed, 413, "body", "payload_too_large")
    # What the client got to send includes what the kernels' socket buffers took in on loopback
    # (a few MB); the body it offered was 160 MB.
    assert streamed.closed and streamed.sent < 16 * 1024 * 1024, streamed.sent


def test_every_413_of_an_upload_quotes_the_one_limit(server, api_key, service_settings):
    """Issue 25 item 8: the guard (from the body's length) quoted the file limit plus the multipart
    allowance, the parser the file limit. Every door now quotes TIDE_MAX_UPLOAD_BYTES alone."""
    from app.uploads import MULTIPART_OVERHEAD

    limit = service_settings.max_upload_bytes
    head = b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="big.txt"\r\n\r\n'

    def upload(file_bytes: int, *, declared: bool) -> dict:
        body = head + b"a" * file_bytes + b"\r\n--XyZ--\r\n"
        if declared:
            start = _head("POST", "/files", key=api_key, length=len(body), content_type="multipart/form-data; boundary=XyZ")
            chunks = (body[i:i + 65536] for i in range(0, len(body), 65536))
        else:
            start = _head("POST", "/files", key=api_key, chunked=True, content_type="multipart/form-data; boundary=XyZ")
            chunks = (f"{len(part):x}\r\n".encode() + part + b"\r\n" for part in (body[i:i + 65536] for i in range(0, len(body), 65536)))
        return _error(request(server, start, chunks), 413, "file", "file_too_large")

    answers = {
        "Content-Length past the body's limit (the guard)": upload(limit + MULTIPART_OVERHEAD + 1, declared=True),
        "chunked past the body's limit (the guard)": upload(limit + 2 * MULTIPART_OVERHEAD, declared=False),
        "Content-Length within the body's limit, the file past its own (the parser)": upload(limit + 1, declared=True),
        "chunked, the file just past its limit (the parser)": upload(limit + 1, declared=False),
    }
    for door, error in answers.items():
        assert f"limit of {limit} bytes" in error["message"] and "TIDE_MAX_UPLOAD_BYTES" in error["message"], (door, error)
        assert str(limit + MULTIPART_OVERHEAD) not in error["message"], (door, error)


def test_a_body_within_the_limit_still_works(server, api_key):
    body = b'{"base_model": "no-such-model", "terms": ["kernel"]}'
    answer = request(server, _head("POST", "/extend", key=api_key, length=len(body)) + body)
    _error(answer, 422, "base_model", "model_not_found")
    assert not answer.closed  # ordinary errors keep the connection


def test_what_uvicorn_cannot_parse_it_answers_itself(server):
    # Before the application runs, so outside the error shape (docs/service.md says so).
    answer = request(server, b"THIS IS NOT HTTP\r\n\r\n")
    assert answer.status == 400 and answer.body == b"Invalid HTTP request received." and answer.closed


# -- item 6: a body that stops arriving ------------------------------------------------------

def test_a_stalled_body_gets_408_and_the_connection_is_closed(server, api_key):
    # Content-Length promises 1000 bytes, 100 arrive, then nothing (TIDE_REQUEST_BODY_TIMEOUT_S=1 here).
    started = time.monotonic()
    answer = request(server, _head("POST", "/extend", key=api_key, length=1000) + b"{" + b" " * 99, timeout=20)
    error = _error(answer, 408, "body", "request_timeout")
    assert "100 bytes" in error["message"]
    assert answer.closed
    assert time.monotonic() - started < 15  # freed long before a client's own patience would run out


def test_a_stalled_upload_gets_408_and_leaves_no_file(server, api_key, service_settings):
    before = set(service_settings.resolved_uploads_dir.iterdir())
    start = b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="c.txt"\r\n\r\nsome text that stops here'
    head = _head("POST", "/files", key=api_key, length=50_000, content_type="multipart/form-data; boundary=XyZ")
    answer = request(server, head + start, timeout=20)
    _error(answer, 408, "body", "request_timeout")
    assert answer.closed
    assert set(service_settings.resolved_uploads_dir.iterdir()) == before


# -- item 5: an upload cut short -------------------------------------------------------------

@pytest.mark.parametrize("body", [
    b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="c.txt"\r\n\r\nhello',
    b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="c.txt"\r\n\r\nhello\r\n--XyZ',
])
def test_an_upload_without_its_closing_boundary_is_refused(client, auth, service_settings, body):
    before = set(service_settings.resolved_uploads_dir.iterdir())
    response = client.post("/files", content=body, headers={**auth, "Content-Type": "multipart/form-data; boundary=XyZ"})
    error = assert_error(response, 422, "file", "incomplete_upload")
    assert "closing boundary" in error["message"]
    assert set(service_settings.resolved_uploads_dir.iterdir()) == before


def test_a_full_disk_answers_507_and_keeps_nothing(service_settings, tmp_path):
    """The upload folder is a real 512 KiB tmpfs, mounted in a private mount namespace (unshare
    needs no root where user namespaces are enabled) for the server process only."""
    from app.db.engine import init_db, make_engine, make_sessionmaker
    from app.db.keys import create_key
    from app.db.models import StoredFile

    settings = service_settings.model_copy(update={"data_dir": tmp_path, "max_upload_bytes": 4 * 1024 * 1024})
    uploads = settings.resolved_uploads_dir
    uploads.mkdir(parents=True)
    engine = make_engine(settings.resolved_database_url)
    init_db(engine)
    sessions = make_sessionmaker(engine)
    with sessions() as session:
        key = create_key(session, "disk")[1]
    mount = f"mount -t tmpfs -o size=512k tmpfs {uploads} && exec \"$@\""
    wrapper = [shutil.which("unshare"), "--user", "--map-root-user", "--mount", "sh", "-c", mount, "sh"]

    def upload(size: int):
        payload = (b"word " * (size // 5 + 1))[:size]
        body = (b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="c.txt"\r\n\r\n' + payload + b"\r\n--XyZ--\r\n")
        head = _head("POST", "/files", key=key, length=len(body), content_type="multipart/form-data; boundary=XyZ")
        chunks = (body[i:i + 65536] for i in range(0, len(body), 65536))
        return request(server, head, chunks)

    with served_api(settings, tmp_path / "uvicorn.log", wrapper=wrapper) as server:
        inside = f"/proc/{server.process.pid}/root{uploads}"
        full = upload(1024 * 1024)
        error = _error(full, 507, "file", "insufficient_storage")
        assert "space" in error["message"]
        assert list(__import__("os").listdir(inside)) == []  # the partial file is gone
        fits = upload(300 * 1024)  # the space came back: the next upload is stored
        assert fits.status == 201, fits.body
    with sessions() as session:
        assert [f.bytes for f in session.query(StoredFile).all()] == [300 * 1024]
    engine.dispose()


# -- item 4: cursors -------------------------------------------------------------------------

@pytest.mark.parametrize("cursor", ["99999999999999999999", "9223372036854775808", "²", "١٢", "-1", "1e3"])
def test_a_bad_cursor_is_422_naming_it(client, auth, cursor):
    error = assert_error(client.get("/jobs", params={"cursor": cursor}, headers=auth), 422, "cursor", "invalid_request")
    assert "next_cursor" in error["message"]


def test_the_largest_cursor_is_a_valid_first_page(client, auth):
    response = client.get("/jobs", params={"cursor": str(2**63 - 1), "limit": 1}, headers=auth)
    assert response.status_code == 200, response.text
