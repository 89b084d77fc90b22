"""A burst of concurrent polls against a real uvicorn server with a deliberately tiny database
pool: every request must succeed. (A session held until FastAPI serialises the response in
another pool thread deadlocks here: all threads wait for a connection that only a free thread
could release, until the 30 s pool timeout turns the burst into 500s.)"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import uvicorn

from benchmarks.polling import poll_concurrently


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_burst_of_polls_with_a_tiny_pool_all_succeed(service_settings, tmp_path):
    from app.db.engine import make_engine, make_sessionmaker
    from app.db.keys import create_key
    from app.main import create_app

    settings = service_settings.model_copy(update={"data_dir": tmp_path})
    app = create_app(settings)
    app.state.engine.dispose()
    app.state.engine = make_engine(settings.resolved_database_url, pool_size=1)  # 2 connections, 40 threads
    app.state.sessions = make_sessionmaker(app.state.engine)
    with app.state.sessions() as session:
        key = create_key(session, "burst")[1]
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        result = asyncio.run(poll_concurrently(f"http://127.0.0.1:{port}/jobs", key, clients=60, seconds=2.0, warmup=0.0))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert result["errors"] == 0, result
    assert result["requests"] >= 60, result
    assert result["max_ms"] < 10_000, result
