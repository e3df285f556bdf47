"""Reviewer sign-in for the review page: tokens from config, signed session cookies, CSRF tokens.

A reviewer signs in with the token configured for them (stored in config as
its sha256, or in clear for local trials); tokens are compared as digests in
constant time against every reviewer. A session is a cookie
(`HttpOnly; SameSite=Strict; Path=/`) holding the reviewer's name, an expiry
and a random nonce, signed with HMAC-SHA256 under a key derived from the
session secret and the reviewer's token digest: changing a reviewer's token,
or removing the reviewer, ends their sessions. Tenants are read from config on
every request, never from the cookie.

CSRF: every write made with the cookie must carry `X-CSRF-Token`, a
synchronizer token derived from the session (HMAC of its nonce), which the
page reads from `GET /api/v1/review/session`. Sign-in itself uses a signed
double-submit token: the sign-in page sets a cookie holding a random nonce and
an expiry signed with the session secret, and the form echoes it in the
header. Both must be equal *and* the token must be one this server signed and
still valid (`login_token_ok`), so a pair an attacker made up (a cookie planted
from a sibling domain, say) is refused. Scripts may instead send
`Authorization: Bearer <reviewer token>`, which no browser attaches on its own,
so needs no CSRF token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass

from service.config import ReviewConfig

__all__ = ["LOGIN_COOKIE", "LOGIN_TTL_S", "SESSION_COOKIE", "Reviewer", "ReviewerAuth", "Session"]

SESSION_COOKIE = "ragmon_review_session"
LOGIN_COOKIE = "ragmon_review_login"
LOGIN_TTL_S = 3600
"""How long a sign-in page's token stays good (and its cookie's max-age)."""


@dataclass(frozen=True, slots=True)
class Reviewer:
    """A configured reviewer and the tenants they may see."""

    name: str
    tenants: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in reviewer, the session's CSRF token and when it ends (unix seconds)."""

    reviewer: Reviewer
    csrf: str
    expires: int


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ReviewerAuth:
    """Checks reviewer tokens and issues and reads session cookies and CSRF tokens."""

    def __init__(self, config: ReviewConfig) -> None:
        self.config = config
        secret = (
            config.session_secret.get_secret_value() if config.session_secret else secrets.token_urlsafe(32)
        )
        self._secret = secret.encode()
        self._login_key = hmac.new(self._secret, b"login", hashlib.sha256).digest()
        self._digests: dict[str, bytes] = {}
        for name, reviewer in config.reviewers.items():
            if reviewer.token_sha256 is not None:
                digest = bytes.fromhex(reviewer.token_sha256)
            else:
                token = reviewer.token.get_secret_value() if reviewer.token else ""
                digest = hashlib.sha256(token.encode()).digest()
            self._digests[name] = digest

    def reviewer(self, name: str) -> Reviewer | None:
        found = self.config.reviewers.get(name)
        return None if found is None else Reviewer(name, tuple(found.tenants))

    def by_token(self, token: str) -> Reviewer | None:
        """The reviewer whose token this is, or None; the time taken does not depend on which matched."""
        candidate = hashlib.sha256(token.encode()).digest()
        matched = None
        for name, digest in self._digests.items():
            if hmac.compare_digest(digest, candidate):
                matched = name
        return None if matched is None else self.reviewer(matched)

    def _key(self, name: str) -> bytes:
        return hmac.new(self._secret, b"session\x00" + self._digests[name], hashlib.sha256).digest()

    def issue(self, reviewer: Reviewer, now: float | None = None) -> str:
        """A new session cookie value for `reviewer`."""
        expires = int((time.time() if now is None else now) + self.config.session_ttl_s)
        payload = _b64(f"{reviewer.name}\x00{expires}\x00{secrets.token_urlsafe(16)}".encode())
        signature = _b64(hmac.new(self._key(reviewer.name), payload.encode(), hashlib.sha256).digest())
        return f"{payload}.{signature}"

    def read(self, cookie: str | None, now: float | None = None) -> Session | None:
        """The session a cookie value stands for, or None (malformed, forged, expired, reviewer gone)."""
        if not cookie or cookie.count(".") != 1:
            return None
        payload, signature = cookie.split(".")
        try:
            name, expires_text, nonce = _unb64(payload).decode().split("\x00")
            expires = int(expires_text)
            given = _unb64(signature)
        except (ValueError, UnicodeDecodeError):
            return None
        if name not in self._digests:
            return None
        expected = hmac.new(self._key(name), payload.encode(), hashlib.sha256).digest()
        if not hmac.compare_digest(expected, given):
            return None
        if expires < (time.time() if now is None else now):
            return None
        reviewer = self.reviewer(name)
        if reviewer is None:
            return None
        csrf = _b64(hmac.new(self._key(name), b"csrf\x00" + nonce.encode(), hashlib.sha256).digest())
        return Session(reviewer, csrf, expires)

    def new_login_token(self, now: float | None = None) -> str:
        """A sign-in page's double-submit token: a random nonce and an expiry, signed."""
        expires = int((time.time() if now is None else now) + LOGIN_TTL_S)
        payload = f"{secrets.token_urlsafe(18)}.{expires}"
        return f"{payload}.{self._login_signature(payload)}"

    def _login_signature(self, payload: str) -> str:
        return _b64(hmac.new(self._login_key, payload.encode(), hashlib.sha256).digest())

    def login_token_ok(self, header: str | None, cookie: str | None, now: float | None = None) -> bool:
        """The sign-in's CSRF check: header and cookie carry the same token, this server signed it
        (`new_login_token`, under the session secret) and it has not expired."""
        if cookie is None or not self.same(header, cookie):
            return False
        parts = cookie.split(".")
        if len(parts) != 3 or not parts[1].isdigit():
            return False
        nonce, expires, signature = parts
        if not hmac.compare_digest(self._login_signature(f"{nonce}.{expires}").encode(), signature.encode()):
            return False
        return int(expires) >= (time.time() if now is None else now)

    @staticmethod
    def same(a: str | None, b: str | None) -> bool:
        """Constant-time equality of two tokens; False when either is missing."""
        return bool(a) and bool(b) and hmac.compare_digest(str(a).encode(), str(b).encode())
