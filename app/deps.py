"""What routes get injected: settings, a database session, the caller's API key, the queue."""

from __future__ import annotations

from typing import Annotated, Iterator

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from .db.keys import authenticate
from .db.models import ApiKey
from .errors import ApiError
from .settings import Settings

_bearer = HTTPBearer(auto_error=False, description="An API key from `tide keys create NAME`")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def get_queue(request: Request):
    return request.app.state.queue


def current_key(
    db: Annotated[Session, Depends(get_db)],
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None:
        raise ApiError(
            401, "unauthorized", "missing API key: send the header 'Authorization: Bearer <key>' (create a key with `tide keys create NAME`)",
            "Authorization", challenge,
        )
    key = authenticate(db, credentials.credentials)
    if key is None:
        raise ApiError(401, "unauthorized", "invalid or revoked API key; check the key or create a new one with `tide keys create NAME`", "Authorization", challenge)
    return key


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Session, Depends(get_db)]
KeyDep = Annotated[ApiKey, Depends(current_key)]
