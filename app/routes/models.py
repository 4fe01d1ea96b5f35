"""GET /v1/models and /v1/models/{id}: the logical model types, never the concrete models."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from app.auth import Caller, authenticate
from app.dispatch import ModelRouter
from app.protocol import ErrorResponse, ModelCard, ModelList

router = APIRouter()


@router.get("/v1/models", response_model=ModelList, responses={401: {"model": ErrorResponse}})
async def list_models(request: Request, caller: Caller = Depends(authenticate)) -> ModelList:
    models: ModelRouter = request.app.state.models
    return ModelList(data=[ModelCard(id=name, created=models.created) for name in models.names])


@router.get(
    "/v1/models/{model_id}",
    response_model=ModelCard,
    responses={401: {"model": ErrorResponse}, 404: {"model": ErrorResponse}},
)
async def retrieve_model(
    model_id: str, request: Request, caller: Caller = Depends(authenticate)
) -> ModelCard:
    models: ModelRouter = request.app.state.models
    return ModelCard(id=models.get(model_id).name, created=models.created)
