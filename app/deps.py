"""What routes get injected: settings, a database session, the caller's API key, the queue.

The key comes from `Authorization: Bearer`, or from a signed-in browser's session cookie (pages)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from .db.browser_sessions import COOKIE_NAME, CSRF_HEADER, csrf_matches, session_key
from .db.keys import authenticate
from .db.models import ApiKey
from .errors import ApiError
from .settings import Settings

_bearer = HTTPBearer(auto_error=False, description="An API key from `tide keys create NAME`")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_sessions(request: Request) -> sessionmaker[Session]:
    """Routes open their session with `with sessions() as db:` inside their own body, so a
    pooled connection is held only while the route's thread runs. (A session injected by a
    generator dependency stays open until FastAPI has serialised the response — in another
    pool thread for sync routes — so a burst of requests can leave every thread waiting for
    a connection that only a free thread could release: a deadlock until the pool timeout.)"""
    return request.app.state.sessions


def get_queue(request: Request):
    return request.app.state.queue


def get_base_tokenizers(request: Request):
    return request.app.state.base_tokenizers


def key_for_token(sessions: sessionmaker[Session], token: str | None) -> ApiKey:
    """The API key a bearer token belongs to; ApiError 401 when there is none or it is revoked."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if not token:
        raise ApiError(
            401, "unauthorized", "missing API key: send the header 'Authorization: Bearer <key>' (create a key with `tide keys create NAME`)",
            "Authorization", challenge,
        )
    # Its own short session, closed in this same thread (see get_sessions).
    with sessions() as session:
        key = authenticate(session, token)
    if key is None:
        raise ApiError(401, "unauthorized", "invalid or revoked API key; check the key or create a new one with `tide keys create NAME`", "Authorization", challenge)
    return key


def current_key(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    # A request with a body was authenticated before its body was read (app.guard).
    checked = getattr(request.state, "api_key", None)
    if checked is not None:
        return checked
    if credentials is None and COOKIE_NAME in request.cookies:
        return browser_key(request.app.state.sessions, request.cookies[COOKIE_NAME], request.method,
                           request.headers.get(CSRF_HEADER))
    return key_for_token(request.app.state.sessions, credentials.credentials if credentials else None)


_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def browser_key(sessions: sessionmaker[Session], cookie_token: str, method: str, csrf: str | None) -> ApiKey:
    """The key behind a browser's session cookie. A browser attaches cookies to requests other
    sites trigger too, so a state-changing request must also carry the page's CSRF token
    (a safe `method` checks the session alone)."""
    with sessions() as session:
        key = session_key(session, cookie_token)
    if key is None:
        raise ApiError(
            401, "session_expired",
            "this browser session has ended (signed out, expired, or its API key was revoked); sign in again at /ui/login",
            "Cookie",
        )
    if method not in _SAFE_METHODS and not csrf_matches(cookie_token, csrf):
        raise ApiError(
            403, "csrf_token_invalid",
            f"a signed-in browser must send the page's {CSRF_HEADER} header with {method} requests; "
            "reload the page and try again (scripts: use Authorization: Bearer <key> instead of the cookie)",
            CSRF_HEADER,
        )
    return key


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionsDep = Annotated[sessionmaker[Session], Depends(get_sessions)]
KeyDep = Annotated[ApiKey, Depends(current_key)]
