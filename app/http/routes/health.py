"""Liveness and readiness, no key needed."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from app.serving.endpoints import ModelEndpoints

router = APIRouter()


@router.get("/health")
async def health() -> dict[str, str]:
    """Liveness: the ingress answers."""
    return {"status": "ok"}


@router.get("/ready", responses={503: {"description": "Some model type has no replica yet."}})
async def ready(request: Request) -> JSONResponse:
    """Readiness: every model type can serve (503 until then, with each type's state)."""
    models: ModelEndpoints = request.app.state.models
    states = models.readiness()
    ok = all(state == "ready" for state in states.values())
    return JSONResponse(
        {"status": "ready" if ok else "not_ready", "model_types": states},
        status_code=200 if ok else 503,
    )
