"""The FastAPI application: `create_app(settings)` wires settings, database, queue and routes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from . import errors, pages
from .base_tokenizers import BaseTokenizers
from .db.engine import init_db, make_engine, make_sessionmaker
from .guard import RequestGuard
from .queue import JobQueue
from .rate_limit import SubmitRate
from .routes import artifacts, files, health, jobs, models
from .settings import Settings, get_settings
from .storage import ensure_dirs
from .sweeper import SweepMemory, sweep

log = logging.getLogger("tide.api")

DESCRIPTION = """Extend a causal language model's vocabulary with domain terms and train only the new rows.

1. `POST /extend` with a `base_model` and `terms` (or a corpus uploaded with `POST /files`).
2. Poll `GET /jobs/{id}` (or `GET /jobs/{id}/events?after=`).
3. Download `GET /jobs/{id}/archive` (or single files listed by `GET /jobs/{id}/artifacts`).

Every request needs `Authorization: Bearer <key>` (create one with `tide keys create NAME`).
In a browser, sign in at `/ui/login` instead: the pages, and this API, then accept its session cookie.
Every error has the shape `{"error": {"code", "message", "param"}}`.
"""


async def _sweep_forever(app: FastAPI, stop: asyncio.Event) -> None:
    settings: Settings = app.state.settings
    memory = SweepMemory()
    while not stop.is_set():
        try:
            await run_in_threadpool(sweep, settings, app.state.sessions, app.state.queue, memory)
        except Exception:
            log.exception("sweep failed; trying again in %.0f s", settings.sweep_interval_s)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.sweep_interval_s)


@asynccontextmanager
async def _lifespan(app: FastAPI):
    # The built-in models' tokenizers, extracted now on a new data folder, so their jobs' terms
    # are checked at submit from the first request (app/base_tokenizers.py).
    app.state.base_tokenizers.prepare_builtins()
    # transformers imported and the tokenizers on disk loaded before the server answers anything:
    # parallel first submits all find them ready (issue 38).
    await run_in_threadpool(app.state.base_tokenizers.warm_up)
    stop = asyncio.Event()
    task = asyncio.create_task(_sweep_forever(app, stop))
    try:
        yield
    finally:
        app.state.base_tokenizers.close()
        # Stopped, not cancelled: cancelling the await leaves a sweep running on in its thread,
        # deleting files after the service has shut down (and after the engine is disposed).
        stop.set()
        await task
        app.state.queue.close()
        app.state.submit_rate.close()
        app.state.engine.dispose()


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    ensure_dirs(settings)
    engine = make_engine(settings.resolved_database_url)
    init_db(engine)

    app = FastAPI(title="TIDE", version="0.1.0", description=DESCRIPTION, lifespan=_lifespan)
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = make_sessionmaker(engine)
    app.state.queue = JobQueue(settings)
    app.state.base_tokenizers = BaseTokenizers(settings)
    app.state.submit_rate = SubmitRate(settings)
    errors.install(app)
    app.add_middleware(RequestGuard, settings=settings, sessions=app.state.sessions)
    for module in (health, jobs, files, artifacts, models):
        app.include_router(module.router)
    pages.install(app)
    return app
