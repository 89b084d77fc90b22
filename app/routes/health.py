"""Liveness and readiness (no API key needed)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Depends
from sqlalchemy import text

from ..deps import SessionsDep, get_queue
from ..errors import ApiError
from ..schemas import ErrorResponse, Health, Ready

router = APIRouter(tags=["health"])
log = logging.getLogger("tide.api")


@router.get("/healthz", response_model=Health, summary="The API process is up")
def healthz() -> Health:
    return Health(status="ok")


@router.get(
    "/readyz",
    response_model=Ready,
    summary="Database, Redis and at least one worker answer",
    responses={503: {"model": ErrorResponse, "description": "Something the service needs is not answering"}},
)
def readyz(sessions: SessionsDep, queue=Depends(get_queue)) -> Ready:
    problems = []
    try:
        with sessions() as db:
            db.execute(text("SELECT 1"))
    except Exception as exc:
        log.warning("readyz: database: %s", exc)
        problems.append("database is not answering")
    workers = 0
    try:
        queue.ping_redis()
        workers = queue.workers()
        if workers == 0:
            problems.append(f"no worker answered a ping on queue {queue.settings.queue!r}; start one with `tide worker`")
    except Exception as exc:
        log.warning("readyz: redis: %s", exc)
        problems.append(f"Redis at {queue.settings.redis_url.split('@')[-1]} is not answering")
    if problems:
        raise ApiError(503, "not_ready", "; ".join(problems))
    return Ready(status="ready", database="ok", redis="ok", workers=workers)
