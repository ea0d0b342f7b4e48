"""Server-side sessions of the web pages, and their CSRF tokens.

A browser signs in once with an API key (typed into a form, never put in a
URL); the key is checked by :class:`~dpgate.auth.KeyStore` and then forgotten.
The browser holds only a random session id in a cookie (``HttpOnly``,
``SameSite=Strict``, ``Path=/ui``, ``Secure`` when the request came over TLS);
everything else lives here, in the server's memory:

* the principal's key name, key id, role and consumer (re-checked against the
  keys file on every request, so a revoked key ends its sessions at once);
* a CSRF token (synchroniser token pattern, OWASP CSRF Prevention Cheat Sheet):
  32 random bytes drawn per session, sent in a hidden field of every form and
  compared in constant time with :func:`hmac.compare_digest` on every POST.
  Signing in starts a fresh session (new id, new token: no fixation); the
  sign-in form itself is protected by the token of an anonymous pre-session.

Only a SHA-256 digest of each session id is kept (a memory dump does not give
working cookies). Sessions end after :data:`IDLE_TIMEOUT_S` without a request,
:data:`ABSOLUTE_TIMEOUT_S` after sign-in, or on sign-out. The store is bounded:
at most :data:`MAX_SESSIONS` sessions (anonymous ones are evicted first, then
the least recently used) and :data:`MAX_SESSIONS_PER_KEY` per API key.

Sessions are per process: behind several replicas, route a browser to one
replica (sticky sessions) or sign in again after a switch.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from dpgate.auth import Principal

__all__ = [
    "ABSOLUTE_TIMEOUT_S",
    "ANONYMOUS_TIMEOUT_S",
    "COOKIE_NAME",
    "IDLE_TIMEOUT_S",
    "MAX_SESSIONS",
    "MAX_SESSIONS_PER_KEY",
    "Session",
    "SessionStore",
    "csrf_matches",
]

#: Name of the session cookie.
COOKIE_NAME = "dpgate_session"
#: A signed-in session ends after this many seconds without a request (30 minutes).
IDLE_TIMEOUT_S = 30 * 60
#: A signed-in session ends this many seconds after sign-in, used or not (12 hours).
ABSOLUTE_TIMEOUT_S = 12 * 60 * 60
#: An anonymous pre-session (the sign-in form's CSRF token) lives this long (15 minutes).
ANONYMOUS_TIMEOUT_S = 15 * 60
#: Most sessions kept at once (anonymous ones are evicted first).
MAX_SESSIONS = 10_000
#: Most signed-in sessions of one API key (the oldest is ended when a new one starts).
MAX_SESSIONS_PER_KEY = 20
#: Most remembered items per session (flash messages, explained queries).
_MAX_ITEMS = 16


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class Session:
    """One browser session (mutable; guarded by the store's lock for eviction only).

    Attributes:
        csrf_token: the synchroniser token every form of this session must send back.
        principal: the signed-in principal, or None for an anonymous pre-session.
        created: ``time.monotonic()`` at creation (sign-in for signed-in sessions).
        last_seen: ``time.monotonic()`` of the last request.
        flash: messages shown once on the next page (text, never markup).
        explained: digests of the requests this session explained (the console
            runs only what was explained first), most recent last.
    """

    csrf_token: str
    principal: Principal | None = None
    created: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    flash: list[tuple[str, str]] = field(default_factory=list)
    explained: list[str] = field(default_factory=list)

    @property
    def signed_in(self) -> bool:
        """Whether a principal signed in to this session."""
        return self.principal is not None

    def add_flash(self, kind: str, text: str) -> None:
        """Queue a message (``kind`` "ok", "warn" or "error") for the next page."""
        self.flash = [*self.flash, (kind, text)][-_MAX_ITEMS:]

    def pop_flash(self) -> list[tuple[str, str]]:
        """The queued messages, removed."""
        out, self.flash = self.flash, []
        return out

    def remember_explained(self, digest: str) -> None:
        """Record that the request with ``digest`` was explained in this session."""
        self.explained = [d for d in self.explained if d != digest][-(_MAX_ITEMS - 1):] + [digest]


def csrf_matches(session: Session | None, submitted: Any) -> bool:
    """Whether ``submitted`` (a form value) equals the session's CSRF token (constant time).

    False for no session, a missing or non-text value.
    """
    if session is None or not isinstance(submitted, str) or not submitted:
        return False
    return hmac.compare_digest(session.csrf_token.encode(), submitted.encode("utf-8", "surrogatepass"))


class SessionStore:
    """The sessions of one process (thread-safe, bounded, expiring).

    Args:
        idle_timeout_s, absolute_timeout_s, anonymous_timeout_s: lifetimes (seconds).
        max_sessions: most sessions kept.
        max_per_key: most signed-in sessions per API key.
        clock: monotonic clock (tests inject one).
    """

    def __init__(
        self,
        *,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        absolute_timeout_s: float = ABSOLUTE_TIMEOUT_S,
        anonymous_timeout_s: float = ANONYMOUS_TIMEOUT_S,
        max_sessions: int = MAX_SESSIONS,
        max_per_key: int = MAX_SESSIONS_PER_KEY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.idle_timeout_s = float(idle_timeout_s)
        self.absolute_timeout_s = float(absolute_timeout_s)
        self.anonymous_timeout_s = float(anonymous_timeout_s)
        self.max_sessions = int(max_sessions)
        self.max_per_key = int(max_per_key)
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: OrderedDict[str, Session] = OrderedDict()  # digest → session, LRU order

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def _expired(self, s: Session, now: float) -> bool:
        if s.principal is None:
            return now - s.created > self.anonymous_timeout_s
        return now - s.last_seen > self.idle_timeout_s or now - s.created > self.absolute_timeout_s

    def _new(self, principal: Principal | None) -> tuple[str, Session]:
        now = self._clock()
        session_id = secrets.token_urlsafe(32)
        session = Session(csrf_token=secrets.token_urlsafe(32), principal=principal, created=now, last_seen=now)
        with self._lock:
            if principal is not None:
                mine = [d for d, s in self._sessions.items()
                        if s.principal is not None and s.principal.key_id == principal.key_id]
                for d in mine[: max(0, len(mine) - self.max_per_key + 1)]:
                    del self._sessions[d]
            while len(self._sessions) >= self.max_sessions:
                victim = next((d for d, s in self._sessions.items() if s.principal is None), None)
                if victim is None:
                    victim = next(iter(self._sessions))
                del self._sessions[victim]
            self._sessions[_digest(session_id)] = session
        return session_id, session

    def anonymous(self) -> tuple[str, Session]:
        """A new anonymous pre-session (for the sign-in form's CSRF token): ``(id, session)``."""
        return self._new(None)

    def sign_in(self, principal: Principal, *, previous: str | None = None) -> tuple[str, Session]:
        """End ``previous`` (if any) and start a signed-in session with a new id and token."""
        if previous:
            self.end(previous)
        return self._new(principal)

    def get(self, session_id: str | None) -> Session | None:
        """The live session with this id (touching it), or None (unknown, expired or ended)."""
        if not session_id or len(session_id) > 128:
            return None
        digest = _digest(session_id)
        now = self._clock()
        with self._lock:
            session = self._sessions.get(digest)
            if session is None:
                return None
            if self._expired(session, now):
                del self._sessions[digest]
                return None
            session.last_seen = now
            self._sessions.move_to_end(digest)
            return session

    def end(self, session_id: str | None) -> None:
        """End a session (sign-out); unknown ids are ignored."""
        if session_id:
            with self._lock:
                self._sessions.pop(_digest(session_id), None)

    def end_key(self, key_id: str) -> int:
        """End every session of one API key (e.g. revoked); returns how many ended."""
        with self._lock:
            doomed = [d for d, s in self._sessions.items() if s.principal is not None and s.principal.key_id == key_id]
            for d in doomed:
                del self._sessions[d]
            return len(doomed)

    def purge(self) -> int:
        """Drop every expired session; returns how many were dropped."""
        now = self._clock()
        with self._lock:
            doomed = [d for d, s in self._sessions.items() if self._expired(s, now)]
            for d in doomed:
                del self._sessions[d]
            return len(doomed)

