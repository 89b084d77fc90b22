"""The API under a real uvicorn server, in its own process, on a free loopback port, and raw
HTTP/1.1 over a socket: what a hostile or broken client sends is exactly what the server gets
(a test client would hand the app a whole body at once)."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tests.conftest import REPO

from .conftest import settings_env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Server:
    host: str
    port: int
    process: subprocess.Popen
    log_path: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


@contextmanager
def served_api(settings, log_path: Path, *, wrapper: list[str] = ()) -> Iterator[Server]:
    """`uvicorn app.main:create_app --factory` with `settings` (as TIDE_* variables). `wrapper`
    runs it inside another command (e.g. a shell that mounts a filesystem first)."""
    port = _free_port()
    command = [
        sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--lifespan", "off", "--log-level", "warning",
    ]
    with log_path.open("ab") as log:
        process = subprocess.Popen([*wrapper, *command], cwd=REPO, env=settings_env(settings), stdout=log, stderr=subprocess.STDOUT)
    server = Server("127.0.0.1", port, process, log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"uvicorn exited with {process.returncode}:\n{server.log_tail()}"
            try:
                if request(server, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").status == 200:
                    break
            except OSError:
                assert time.monotonic() < deadline, f"uvicorn did not answer within 60 s:\n{server.log_tail()}"
                time.sleep(0.2)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server closed the connection after answering
    sent: int  # body bytes the client got to send before the answer came

    def json(self) -> dict:
        return json.loads(self.body)


def _read_answer(sock: socket.socket, timeout: float) -> tuple[int, dict[str, str], bytes, bool]:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"the server closed the connection without an answer (got {data!r})")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    if "content-length" not in headers and headers.get("connection") == "close":
        # no length (uvicorn's own answer to unparseable input): the body ends where the connection does
        while chunk := sock.recv(65536):
            body += chunk
        return status, headers, body, True
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    sock.settimeout(1.0)  # well under uvicorn's 5 s keep-alive: a close seen here is the answer's own
    try:
        closed = sock.recv(1) == b""
    except ConnectionResetError:
        closed = True
    except socket.timeout:
        closed = False
    return status, headers, body, closed


def request(server: Server, head: bytes, body_chunks: Iterator[bytes] = iter(()), *, timeout: float = 30.0,
            pause_after_body: float = 0.0) -> Answer:
    """Send `head`, then body chunks until the server answers (or they run out), then read the
    answer. Sending stops as soon as an answer is waiting, as a careful client would."""
    sent = 0
    with socket.create_connection((server.host, server.port), timeout=timeout) as sock:
        sock.sendall(head)
        for chunk in body_chunks:
            if select.select([sock], [], [], 0)[0]:
                break  # an answer already: the server will not read the rest
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
        if pause_after_body:
            time.sleep(pause_after_body)
        status, headers, body, closed = _read_answer(sock, timeout)
    return Answer(status, headers, body, closed, sent)
