"""Cross-origin access: closed unless the operator names the origins that may call from a browser.

Keys are secrets that belong in a backend, not in a page (see the spec), so by default no
browser origin may read our answers; `SERVICEAI_CORS_ORIGINS` opens it for development pages.
"""

from __future__ import annotations

from collections.abc import Sequence

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware


def install_cors(api: FastAPI, origins: Sequence[str]) -> None:
    """Answer CORS requests from `origins` only; with none, send no CORS headers at all."""
    if not origins:
        return
    api.add_middleware(
        CORSMiddleware,
        allow_origins=list(origins),
        allow_methods=["GET", "POST", "PATCH", "DELETE"],
        allow_headers=["Authorization", "Content-Type"],
        max_age=600,
    )
