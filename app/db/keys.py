"""API keys: random, shown once, stored only as a sha256 digest."""

from __future__ import annotations

import hashlib
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from .models import ApiKey, utcnow

KEY_PREFIX = "tide_"
_SHOWN_CHARS = 12


def hash_key(plaintext: str) -> str:
    # Keys carry 256 random bits, so a fast hash is enough: there is nothing to brute-force.
    return hashlib.sha256(plaintext.encode("utf-8")).hexdigest()


def create_key(session: Session, name: str) -> tuple[ApiKey, str]:
    plaintext = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(name=name, prefix=plaintext[:_SHOWN_CHARS], key_hash=hash_key(plaintext))
    session.add(key)
    session.commit()
    return key, plaintext


def authenticate(session: Session, plaintext: str) -> ApiKey | None:
    key = session.scalar(select(ApiKey).where(ApiKey.key_hash == hash_key(plaintext)))
    if key is None or key.revoked_at is not None:
        return None
    return key


def find_keys(session: Session, selector: str) -> list[ApiKey]:
    """Active keys matching an id, a shown prefix / whole key, or a name."""
    active = select(ApiKey).where(ApiKey.revoked_at.is_(None))
    if selector.isdigit():
        return list(session.scalars(active.where(ApiKey.id == int(selector))))
    if selector.startswith(KEY_PREFIX):
        if len(selector) > _SHOWN_CHARS:
            return list(session.scalars(active.where(ApiKey.key_hash == hash_key(selector))))
        return list(session.scalars(active.where(ApiKey.prefix == selector)))
    return list(session.scalars(active.where(ApiKey.name == selector)))


def revoke(session: Session, keys: list[ApiKey]) -> None:
    now = utcnow()
    for key in keys:
        key.revoked_at = now
    session.commit()


def list_keys(session: Session) -> list[ApiKey]:
    return list(session.scalars(select(ApiKey).order_by(ApiKey.id)))
