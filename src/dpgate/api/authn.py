"""How the HTTP API reads an API key from a request's headers: one function for the routes'
dependency (:func:`dpgate.api.routes.get_principal`) and for the gate that refuses an
unauthenticated request before its body is read (:class:`dpgate.api.middleware.ApiKeyGate`).

The key is ``Authorization: Bearer <key>`` (first) or ``X-API-Key: <key>``, parsed as FastAPI's
``HTTPBearer`` and ``APIKeyHeader`` (``auto_error=False``) parse them; an ``Authorization``
header with another scheme is explained rather than ignored.
"""

from __future__ import annotations

from dpgate.auth import KEY_PREFIX, KeyStore, Principal
from dpgate.errors import Unauthenticated

__all__ = ["authenticate", "bearer_token"]


def bearer_token(authorization: str | None) -> str | None:
    """The credentials of ``Authorization: Bearer <credentials>``, or None (no header, another
    scheme, or no credentials), as FastAPI's ``HTTPBearer(auto_error=False)`` reads them."""
    if not authorization:
        return None
    scheme, _, credentials = authorization.partition(" ")
    credentials = credentials.strip()
    if not scheme or not credentials or scheme.lower() != "bearer":
        return None
    return credentials


def authenticate(keys: KeyStore, authorization: str | None, api_key: str | None) -> Principal:
    """The principal of a request's key: the bearer token first, then ``X-API-Key``.

    Args:
        keys: the API key store.
        authorization: the ``Authorization`` header, or None.
        api_key: the ``X-API-Key`` header, or None.
    Raises:
        Unauthenticated: no key, a key that matches no principal, a revoked key, or an
            ``Authorization`` header without the ``Bearer`` scheme (the message says how to send it).
    """
    bearer = bearer_token(authorization)
    api_key = api_key or None
    if bearer is None and api_key is None:
        _check_authorization_scheme(authorization)
    return keys.authenticate(bearer if bearer is not None else api_key)


def _check_authorization_scheme(header: str | None) -> None:
    """Explain an ``Authorization`` header that is not ``Bearer <key>``."""
    if header is None or not header.strip():
        return
    scheme, _, rest = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        raise Unauthenticated("the Authorization header has no key after 'Bearer': send 'Authorization: Bearer <key>'")
    if scheme.startswith(KEY_PREFIX) and not rest:
        raise Unauthenticated(
            "the Authorization header needs the Bearer scheme: send 'Authorization: Bearer <key>' "
            "(or 'X-API-Key: <key>')"
        )
    raise Unauthenticated(
        f"unsupported Authorization scheme {scheme[:20]!r}: send 'Authorization: Bearer <key>' "
        "(or 'X-API-Key: <key>')",
        {"scheme": scheme[:20]},
    )
