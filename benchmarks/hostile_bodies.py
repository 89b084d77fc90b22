"""What one hostile request body costs the API: an anonymous 200 MB POST /extend (valid JSON,
a huge corpus_text) and the same body with a valid key, against a real uvicorn serving the app
of a given checkout. Measured: time until the answer, body bytes the client got to send, the
API process's resident memory (before, peak, after), and /healthz latency polled meanwhile.

    .venv/bin/python benchmarks/hostile_bodies.py                       # this checkout
    .venv/bin/python benchmarks/hostile_bodies.py --repo /path/to/other/checkout --label before
    (each run appends its rows to benchmarks/results/hostile_bodies.md)

Redis is not needed: neither request gets as far as the queue.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "hostile_bodies.md"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _memory_mb(pid: int) -> tuple[float, float]:
    """(resident now, peak resident) of a process, in MB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def _get(port: int, path: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def _post(port: int, key: str | None, size: int) -> tuple[int, float, int]:
    """POST a `size`-byte JSON body; (status, seconds to the answer, body bytes sent)."""
    prefix = b'{"base_model": "smollm2-135m", "corpus_text": "'
    suffix = b'"}'
    filler = size - len(prefix) - len(suffix)
    head = [b"POST /extend HTTP/1.1", b"Host: b", b"Content-Type: application/json", f"Content-Length: {size}".encode()]
    if key:
        head.append(f"Authorization: Bearer {key}".encode())
    chunk = b"a" * (1 << 20)
    started = time.perf_counter()
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=300) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n")
        try:
            sock.sendall(prefix)
            sent += len(prefix)
            left = filler
            while left > 0:
                import select

                if select.select([sock], [], [], 0)[0]:
                    break  # answered already
                part = chunk[: min(len(chunk), left)]
                sock.sendall(part)
                sent += len(part)
                left -= len(part)
            else:
                sock.sendall(suffix)
                sent += len(suffix)
        except (BrokenPipeError, ConnectionResetError):
            pass
        data = b""
        while b"\r\n" not in data:
            part = sock.recv(65536)
            if not part:
                break
            data += part
    status = int(data.split(b" ", 2)[1]) if data else 0
    return status, time.perf_counter() - started, sent


def _poll(port: int, stop: threading.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        _get(port, "/healthz")
        latencies.append(time.perf_counter() - began)
        time.sleep(0.05)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout whose app is served")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args()
    repo = args.repo.resolve()
    size = args.mb * 1_000_000
    with tempfile.TemporaryDirectory(prefix="tide-hostile-") as data:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TIDE_")}
        env.update(PYTHONPATH=str(repo), TIDE_DATA_DIR=data, TIDE_REDIS_URL="redis://127.0.0.1:1/0")
        key = subprocess.run(
            [sys.executable, "-c", "from app.cli import main; main()", "keys", "create", "bench"],
            cwd=repo, env=env, capture_output=True, text=True, check=True,
        ).stdout.strip().split()[-1]
        port = _free_port()
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory", "--port", str(port), "--lifespan", "off", "--log-level", "error"],
            cwd=repo, env=env,
        )
        try:
            for _ in range(300):
                try:
                    if _get(port, "/healthz") == 200:
                        break
                except OSError:
                    time.sleep(0.1)
            rows = []
            for who, token in (("anonymous", None), ("valid key", key)):
                before, _peak = _memory_mb(server.pid)
                latencies: list[float] = []
                stop = threading.Event()
                poller = threading.Thread(target=_poll, args=(port, stop, latencies))
                poller.start()
                status, seconds, sent = _post(port, token, size)
                time.sleep(0.5)
                stop.set()
                poller.join()
                after, peak = _memory_mb(server.pid)
                rows.append(
                    f"| {args.label} | {who} | {status} | {seconds:.2f} s | {sent / 1e6:.1f} MB | {before:.0f} / {peak:.0f} / {after:.0f} MB "
                    f"| {statistics.median(latencies) * 1000:.0f} / {max(latencies) * 1000:.0f} ms |"
                )
        finally:
            server.terminate()
            server.wait(timeout=30)
    header = not RESULTS.exists()
    with RESULTS.open("a") as out:
        if header:
            out.write(
                "# One hostile request body against the API\n\n"
                "`benchmarks/hostile_bodies.py`: a 200 MB POST /extend (valid JSON, huge corpus_text) to a real uvicorn, "
                "without a key and with one; /healthz polled every 50 ms meanwhile. Memory is the API process's resident "
                "size before / peak (VmHWM, since start) / after. Loopback, shared 2-core machine: compare rows, not absolutes.\n\n"
                "| code | key | answer | time to answer | body sent | memory before / peak / after | /healthz median / max |\n"
                "| --- | --- | --- | ---: | ---: | --- | --- |\n"
            )
        out.write("\n".join(rows) + "\n")
    print("\n".join(rows))
    print(f"({datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, {os.cpu_count()} CPUs) -> {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
