"""API keys: generation, hashed storage, constant-time verification, revocation.

A key is `fsdpk_<prefix>_<secret>` with 256 random bits of secret. Only its sha256 is stored: for
keys this random a slow password hash adds nothing, and sha256 keeps every write request cheap.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.db.base import utcnow
from api.db.models import ApiKeyRow
from api.typed_numbers import parse_id

KEY_SCHEME = "fsdpk"
_HEX = re.compile(r"[0-9a-f]+")
MAX_NAME_LENGTH = 100


class ApiKeyError(LookupError):
    """A key operation that cannot be done; the message says why."""


@dataclass(frozen=True)
class IssuedKey:
    row: ApiKeyRow
    key: str
    """The plaintext key: shown once, never stored."""


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _prefix_of(key: str) -> str | None:
    parts = key.split("_", 2)  # the secret itself may contain "_"
    # Hex only, as issued: a prefix is compared in SQL, where text such as NUL fails on PostgreSQL.
    if len(parts) != 3 or parts[0] != KEY_SCHEME or len(parts[1]) != 8 or not _HEX.fullmatch(parts[1]):
        return None
    return parts[1]


def create_key(session: Session, name: str) -> IssuedKey:
    """Create and store a key named `name` (unique among active keys)."""
    name = name.strip()
    if not name or len(name) > MAX_NAME_LENGTH or not name.isprintable():
        raise ApiKeyError(f"key name must be 1 to {MAX_NAME_LENGTH} printable characters")
    prefix = secrets.token_hex(4)
    key = f"{KEY_SCHEME}_{prefix}_{secrets.token_urlsafe(32)}"
    row = ApiKeyRow(name=name, prefix=prefix, hashed_key=hash_key(key))
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise ApiKeyError(
            f"an active key named {name!r} exists; revoke it first (`fsdp-planner keys revoke {name}`) "
            "or choose another name"
        ) from None
    return IssuedKey(row=row, key=key)


def list_keys(session: Session) -> list[ApiKeyRow]:
    return list(session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id)))


def revoke_key(session: Session, id_or_name: str) -> ApiKeyRow:
    """Revoke the key with this id, or the active key with this name."""
    row = None
    key_id = parse_id(id_or_name)  # ASCII digits only: '²' is a name, not an id
    if key_id is not None:
        row = session.get(ApiKeyRow, key_id)
    if row is None:
        row = session.scalar(
            select(ApiKeyRow).where(ApiKeyRow.name == id_or_name, ApiKeyRow.revoked_at.is_(None))
        )
    if row is None:
        raise ApiKeyError(f"no key with id or active name {id_or_name!r}; see `fsdp-planner keys list`")
    if row.revoked_at is not None:
        when = f"{row.revoked_at:%Y-%m-%d %H:%M:%S}"
        raise ApiKeyError(f"key {row.id} ({row.name}) was already revoked at {when} UTC")
    row.revoked_at = utcnow()
    session.commit()
    return row


def any_active_key(session: Session) -> bool:
    return session.scalar(select(ApiKeyRow.id).where(ApiKeyRow.revoked_at.is_(None)).limit(1)) is not None


def verify_key(session: Session, key: str) -> ApiKeyRow | None:
    """The active key row matching `key`, or None; the hash comparison runs in constant time."""
    prefix = _prefix_of(key)
    if prefix is None:
        return None
    digest = hash_key(key)
    candidates = session.scalars(
        select(ApiKeyRow).where(ApiKeyRow.prefix == prefix, ApiKeyRow.revoked_at.is_(None))
    )
    for row in candidates:
        if hmac.compare_digest(row.hashed_key, digest):
            return row
    return None
