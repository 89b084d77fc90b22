"""The browser pages: sign in, job list, job page, submit form (server-rendered, thin).

They read through the same pieces as the API (settings, the sessionmaker, `owned_job`,
`job_view`); everything that changes state (submit, upload, cancel, delete) is done by the
page's JavaScript calling the JSON API itself, authenticated by the session cookie plus the
page's CSRF token (app.deps.browser_key).
"""

from __future__ import annotations

import json
from urllib.parse import quote
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from sqlalchemy import select

from ..db.browser_sessions import COOKIE_NAME, csrf_matches, csrf_token, session_key, sign_in, sign_out
from ..db.models import ApiKey, Event, Job, utcnow
from ..deps import SessionsDep, SettingsDep
from ..errors import ApiError
from ..routes.jobs import owned_job
from ..routes.models import list_models
from ..schemas import ExtendRequest
from ..storage import model_dir
from ..views import job_view
from . import views

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
templates.env.globals.update(
    format_number=views.format_number, format_bytes=views.format_bytes, format_duration=views.format_duration,
    STATUS_MARKS=views.STATUS_MARKS,
)

router = APIRouter(prefix="/ui", include_in_schema=False)
home_router = APIRouter(include_in_schema=False)

JOBS_PAGE = "/ui/jobs"
LIST_LIMIT = 50
EVENT_LIMIT = 5000

# Pages hold a user's jobs: never cached, never framed, scripts and styles only from /ui/static.
_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
    "Referrer-Policy": "same-origin",
    "X-Content-Type-Options": "nosniff",
}


class SignInRequired(Exception):
    def __init__(self, path: str):
        super().__init__(path)
        self.path = path


@dataclass
class Visitor:
    key: ApiKey
    csrf: str


def signed_in_visitor(request: Request) -> Visitor | None:
    token = request.cookies.get(COOKIE_NAME)
    if not token:
        return None
    with request.app.state.sessions() as db:
        key = session_key(db, token)
    return Visitor(key, csrf_token(token)) if key is not None else None


def require_visitor(request: Request) -> Visitor:
    visitor = signed_in_visitor(request)
    if visitor is None:
        raise SignInRequired(request.url.path)
    return visitor


VisitorDep = Annotated[Visitor, Depends(require_visitor)]


def sign_in_redirect(_request: Request, exc: SignInRequired) -> RedirectResponse:
    return RedirectResponse(f"/ui/login?next={quote(exc.path)}", status_code=303)


def _safe_next(path: str | None) -> str:
    """Only a page of ours: never another site (//host, \\host, a scheme)."""
    if not path or not path.startswith("/ui/") or path.startswith("//") or "\\" in path or ":" in path:
        return JOBS_PAGE
    return path


def _page(request: Request, template: str, context: dict, status: int = 200) -> HTMLResponse:
    response = templates.TemplateResponse(request, template, context, status_code=status)
    response.headers.update(_PAGE_HEADERS)
    return response


def _error_page(request: Request, visitor: Visitor | None, error: ApiError) -> HTMLResponse:
    return _page(request, "error.html", {"visitor": visitor, "error": error}, status=error.status)


# ---- sign in / out ------------------------------------------------------------------------------


@home_router.get("/")
def home() -> RedirectResponse:
    return RedirectResponse(JOBS_PAGE, status_code=303)


@router.get("")
def ui_home() -> RedirectResponse:
    return RedirectResponse(JOBS_PAGE, status_code=303)


@router.get("/login")
def login_page(request: Request, next: str = JOBS_PAGE, signed_out: bool = False) -> Response:
    if signed_in_visitor(request) is not None:
        return RedirectResponse(_safe_next(next), status_code=303)
    return _page(request, "login.html", {"visitor": None, "next": _safe_next(next), "signed_out": signed_out, "error": None})


@router.post("/login")
def login(
    request: Request,
    sessions: SessionsDep,
    settings: SettingsDep,
    api_key: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = JOBS_PAGE,
) -> Response:
    key = api_key.strip()
    signed = None
    if key:
        with sessions() as db:
            signed = sign_in(db, key, settings.session_hours)
    if signed is None:
        # The key typed is never written back into the page.
        message = (
            "Enter your API key." if not key else
            "That API key is not valid or has been revoked. Check it, or create a new one with `tide keys create NAME`."
        )
        return _page(request, "login.html", {"visitor": None, "next": _safe_next(next), "signed_out": False, "error": message}, status=401)
    _key, token = signed
    response = RedirectResponse(_safe_next(next), status_code=303)
    response.set_cookie(
        COOKIE_NAME, token, max_age=int(settings.session_hours * 3600), path="/", httponly=True, samesite="lax",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
def logout(request: Request, sessions: SessionsDep, csrf: Annotated[str, Form()] = "") -> RedirectResponse:
    token = request.cookies.get(COOKIE_NAME)
    if token and not csrf_matches(token, csrf):
        # Another site cannot sign the user out; a stale page just lands on the job list.
        return RedirectResponse(JOBS_PAGE, status_code=303)
    if token:
        with sessions() as db:
            sign_out(db, token)
    response = RedirectResponse("/ui/login?signed_out=true", status_code=303)
    response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="lax")
    return response


# ---- jobs ---------------------------------------------------------------------------------------


def _job_list(sessions, key: ApiKey) -> dict:
    with sessions() as db:
        rows = list(db.scalars(select(Job).where(Job.owner_id == key.id).order_by(Job.seq.desc()).limit(LIST_LIMIT)))
    now = utcnow()
    jobs = [
        {"job": job_view(row), "adds": views.job_counts(row.request, row.result), "age": views.format_age(row.created_at, now)}
        for row in rows
    ]
    return {"jobs": jobs, "active": any(row.status in views.ACTIVE_STATUSES for row in rows)}


@router.get("/jobs")
def jobs_page(request: Request, visitor: VisitorDep, sessions: SessionsDep) -> HTMLResponse:
    return _page(request, "jobs.html", {"visitor": visitor, **_job_list(sessions, visitor.key)})


@router.get("/jobs/rows")
def jobs_rows(request: Request, visitor: VisitorDep, sessions: SessionsDep) -> HTMLResponse:
    return _page(request, "_job_rows.html", {"visitor": visitor, **_job_list(sessions, visitor.key)})


def _published_extension(settings, job: Job) -> dict | None:
    if job.status != "succeeded" or job.artifacts_deleted:
        return None
    try:
        return json.loads((model_dir(settings, job.id) / "tide_extension.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _job_context(request: Request, sessions, settings, key: ApiKey, job_id: str) -> dict:
    with sessions() as db:
        row = owned_job(db, key, job_id)
        events = list(db.scalars(select(Event).where(Event.job_id == job_id).order_by(Event.id).limit(EVENT_LIMIT)))
    job = job_view(row)
    now = utcnow()
    extension = _published_extension(settings, row)
    terms, more_terms, skipped = views.term_rows(extension)
    progress = [e.payload for e in events if e.kind == "progress"]
    return {
        "job": job,
        "active": row.status in views.ACTIVE_STATUSES,
        "age": views.format_age(row.created_at, now),
        "adds": views.job_counts(row.request, row.result),
        "timeline": views.timeline(row.status, row.request, [(e.payload.get("stage"), e.created_at) for e in events if e.kind == "stage"], row.finished_at, now),
        "curve": views.loss_curve(row.metrics, progress, job.progress.total),
        "verdict": views.verdict(row.metrics),
        "comparison": views.comparison_rows(row.metrics),
        "other_metrics": views.other_metrics(row.metrics),
        "terms": terms,
        "more_terms": more_terms,
        "skipped": skipped,
        "requested_terms": row.request.get("terms") or [],
        "warnings": [e.payload.get("message", "") for e in events if e.kind == "warning"],
        "files": [] if row.artifacts_deleted else (row.manifest or []),
        "archive_bytes": row.archive_bytes,
        "load_lines": views.load_lines(job.id, str(request.base_url), job.id),
    }


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: str, visitor: VisitorDep, sessions: SessionsDep, settings: SettingsDep) -> HTMLResponse:
    try:
        context = _job_context(request, sessions, settings, visitor.key, job_id)
    except ApiError as error:
        return _error_page(request, visitor, error)
    return _page(request, "job.html", {"visitor": visitor, **context})


@router.get("/jobs/{job_id}/live")
def job_live(request: Request, job_id: str, visitor: VisitorDep, sessions: SessionsDep, settings: SettingsDep) -> HTMLResponse:
    try:
        context = _job_context(request, sessions, settings, visitor.key, job_id)
    except ApiError as error:
        return _error_page(request, visitor, error)
    return _page(request, "_job_live.html", {"visitor": visitor, **context})


@router.get("/new")
def new_job_page(request: Request, visitor: VisitorDep, settings: SettingsDep) -> HTMLResponse:
    return _page(request, "new.html", {
        "visitor": visitor,
        "sources": views.source_fields(ExtendRequest),
        "groups": views.option_groups(ExtendRequest),
        "models": list_models(visitor.key, settings).data,
        "max_terms": settings.max_terms,
        "max_upload_bytes": settings.max_upload_bytes,
    })
