#!/usr/bin/env python
"""Container healthcheck of the TIDE image: `tide-healthcheck api [PORT]` or `tide-healthcheck worker`.

api: GET /healthz on this container answers 200.
worker: this container's Celery worker answers a ping through the broker. With the prefork pool
the parent process answers while a child trains, so a long job does not mark the worker unhealthy;
a worker that lost its broker or hung does.
Exit 0 healthy, 1 unhealthy (Docker's convention); one line on stderr says why.
"""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request


def check_api(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            if response.status == 200:
                return None
            return f"/healthz answered {response.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"/healthz did not answer: {exc}"


def check_worker(nodename: str) -> str | None:
    from celery import Celery

    from app.settings import Settings

    broker = Celery(broker=Settings().redis_url)
    try:
        replies = broker.control.ping(destination=[nodename], timeout=5.0, limit=1)
    except Exception as exc:  # any broker failure is an unhealthy worker, with the reason printed
        return f"broker not reachable: {exc}"
    if not any(nodename in reply for reply in replies):
        return f"worker {nodename} did not answer a ping within 5 s"
    return None


def main(argv: list[str]) -> int:
    role = argv[0] if argv else "api"
    if role == "api":
        problem = check_api(int(argv[1]) if len(argv) > 1 else 8000)
    elif role == "worker":
        problem = check_worker(argv[1] if len(argv) > 1 else f"celery@{socket.gethostname()}")
    else:
        print(f"tide-healthcheck: unknown role {role!r}; use 'api [PORT]' or 'worker [NODENAME]'", file=sys.stderr)
        return 1
    if problem:
        print(f"tide-healthcheck {role}: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
