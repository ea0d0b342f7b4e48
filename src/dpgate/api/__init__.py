"""The HTTP API: :func:`create_app` builds the FastAPI application around a gateway.

Nothing is created at import time; ``dpgate serve`` calls ``create_app(settings)``.
"""

from dpgate.api.app import create_app

__all__ = ["create_app"]
