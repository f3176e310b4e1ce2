"""API tokens and roles.

A token is shown once when created (`redrive token create`); the database keeps only
its SHA-256, which is enough for tokens of 256 random bits (a slow hash protects
guessable passwords, not random keys). Roles: `viewer` reads, `operator` also acts.
The API takes the token from the `Authorization: Bearer` header only; the web UI
keeps it in an HttpOnly, SameSite=Strict cookie and guards its forms against
cross-site requests separately (web/session.py).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from typing import Literal

from redrive.service.store import Store

Role = Literal["viewer", "operator"]
ROLES: dict[str, int] = {"viewer": 1, "operator": 2}
TOKEN_PREFIX = "rdv_"  # noqa: S105 - a prefix, not a secret
_CACHE_S = 10.0


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    role: str

    def may(self, role: str) -> bool:
        return ROLES.get(self.role, 0) >= ROLES[role]


ANONYMOUS = Principal("anonymous", "none")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenError(ValueError):
    pass


class Tokens:
    def __init__(self, store: Store) -> None:
        self.store = store
        self._cache: dict[str, tuple[float, Principal | None]] = {}

    def create(self, name: str, role: str) -> str:
        if role not in ROLES:
            raise TokenError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        if not name or len(name) > 200:
            raise TokenError("a token needs a name of 1 to 200 characters")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        if not self.store.add_token(name, role, hash_token(token)):
            raise TokenError(f"a token named {name!r} exists; revoke it or pick another name")
        return token

    def revoke(self, name: str) -> bool:
        done = self.store.revoke_token(name)
        self._cache.clear()
        return bool(done)

    def list(self) -> list[tuple[str, str, object, object]]:
        return self.store.list_tokens()

    def verify(self, token: str) -> Principal | None:
        """The token's principal, or None for an unknown or revoked token."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
            return None
        digest = hash_token(token)
        cached = self._cache.get(digest)
        if cached is not None and time.monotonic() - cached[0] < _CACHE_S:
            return cached[1]
        row = self.store.live_token(digest)
        principal = None
        if row is not None and hmac.compare_digest(row[2], digest):
            principal = Principal(row[0], row[1])
        self._cache[digest] = (time.monotonic(), principal)
        return principal
