"""Browser sign-in: an API key is exchanged once for a random session token.

A page load or a download link cannot send an `Authorization` header, so the browser holds an
HttpOnly cookie with this token instead of the key. Only the token's sha256 is stored; signing out
deletes the row, and revoking the key ends every session made with it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from .keys import authenticate
from .models import ApiKey, BrowserSession, utcnow

COOKIE_NAME = "tide_session"
CSRF_HEADER = "X-CSRF-Token"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def csrf_token(session_token: str) -> str:
    """The value pages send back on state-changing requests. Derived one-way from the session
    token, so it can be written into a page without revealing the cookie; another site cannot
    read the page, so it cannot forge the header."""
    return hashlib.sha256(b"tide-csrf:" + session_token.encode("utf-8")).hexdigest()


def csrf_matches(session_token: str, sent: str | None) -> bool:
    return bool(sent) and hmac.compare_digest(csrf_token(session_token), sent)


def sign_in(db: Session, plaintext_key: str, hours: float) -> tuple[ApiKey, str] | None:
    """A new session for a valid key: (key, cookie token), or None for a wrong or revoked key."""
    key = authenticate(db, plaintext_key)
    if key is None:
        return None
    now = utcnow()
    db.execute(delete(BrowserSession).where(BrowserSession.expires_at < now))
    token = secrets.token_urlsafe(32)
    db.add(BrowserSession(key_id=key.id, token_hash=_digest(token), created_at=now, expires_at=now + timedelta(hours=hours)))
    db.commit()
    return key, token


def session_key(db: Session, token: str) -> ApiKey | None:
    """The key behind a live session token; None when unknown, expired, signed out or revoked."""
    row = db.execute(
        select(ApiKey, BrowserSession.expires_at)
        .join(BrowserSession, BrowserSession.key_id == ApiKey.id)
        .where(BrowserSession.token_hash == _digest(token))
    ).first()
    if row is None or row.expires_at < utcnow() or row.ApiKey.revoked_at is not None:
        return None
    return row.ApiKey


def sign_out(db: Session, token: str) -> None:
    db.execute(delete(BrowserSession).where(BrowserSession.token_hash == _digest(token)))
    db.commit()
