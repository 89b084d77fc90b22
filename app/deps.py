"""What routes get injected: settings, a database session, the caller's API key, the queue."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

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
    return key_for_token(request.app.state.sessions, credentials.credentials if credentials else None)


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionsDep = Annotated[sessionmaker[Session], Depends(get_sessions)]
KeyDep = Annotated[ApiKey, Depends(current_key)]
