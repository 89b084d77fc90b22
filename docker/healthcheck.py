#!/usr/bin/env python
"""Container checks of the TIDE image: `tide-healthcheck api [PORT] | worker [NODENAME] | database`.

api: GET /healthz on this container answers 200.
worker: this container's Celery worker answers a ping through the broker. With the prefork pool
the parent process answers while a child trains, so a long job does not mark the worker unhealthy;
a worker that lost its broker or hung does.
database: the job database (TIDE_DATABASE_URL) accepts a connection; the entrypoint waits for it,
because the API cannot `depends_on` the optional Postgres, and a GPU host's database is remote.
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
    import redis
    from celery import Celery

    from app.settings import Settings

    url = Settings().redis_url
    where = url.split("@")[-1]  # never print the password
    # A plain ping first: Celery would retry an unreachable broker for longer than Docker waits.
    client = redis.Redis.from_url(url, socket_timeout=3, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"Redis at {where} is not answering: {exc}"
    finally:
        client.close()
    broker = Celery(broker=url)
    try:
        replies = broker.control.ping(destination=[nodename], timeout=5.0, limit=1)
    except Exception as exc:  # any broker failure is an unhealthy worker, with the reason printed
        return f"ping through Redis at {where} failed: {exc}"
    finally:
        broker.close()
    if not any(nodename in reply for reply in replies):
        return f"worker {nodename} did not answer a ping within 5 s"
    return None


def check_database() -> str | None:
    from sqlalchemy import create_engine, text

    from app.settings import Settings

    url = Settings().resolved_database_url
    if url.startswith("sqlite"):
        return None  # a local file: nothing to wait for, the app creates it
    engine = create_engine(url, connect_args={"connect_timeout": 3} if url.startswith("postgresql") else {})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means "not yet"; the message says which
        return f"database at {engine.url.render_as_string(hide_password=True)} is not answering: {exc}"
    finally:
        engine.dispose()
    return None


def main(argv: list[str]) -> int:
    role = argv[0] if argv else "api"
    if role == "api":
        problem = check_api(int(argv[1]) if len(argv) > 1 else 8000)
    elif role == "worker":
        problem = check_worker(argv[1] if len(argv) > 1 else f"celery@{socket.gethostname()}")
    elif role == "database":
        problem = check_database()
    else:
        print(f"tide-healthcheck: unknown role {role!r}; use 'api [PORT]', 'worker [NODENAME]' or 'database'", file=sys.stderr)
        return 1
    if problem:
        print(f"tide-healthcheck {role}: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
