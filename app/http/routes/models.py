"""GET /v1/models and /v1/models/{id}: the logical model types (with their context length),
never the concrete models."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from app.accounts.auth import Caller, authenticate
from app.openai.protocol import ErrorResponse, ModelCard, ModelList
from app.serving.dispatch import ModelEndpoints
from app.serving.pipeline import check_allowed

router = APIRouter()


@router.get("/v1/models", response_model=ModelList, responses={401: {"model": ErrorResponse}})
async def list_models(request: Request, caller: Caller = Depends(authenticate)) -> ModelList:
    models: ModelEndpoints = request.app.state.models
    return ModelList(
        data=[await _card(models, name) for name in models.names if caller.may_call(name)]
    )


@router.get(
    "/v1/models/{model_id}",
    response_model=ModelCard,
    responses={401: {"model": ErrorResponse}, 404: {"model": ErrorResponse}},
)
async def retrieve_model(
    model_id: str, request: Request, caller: Caller = Depends(authenticate)
) -> ModelCard:
    models: ModelEndpoints = request.app.state.models
    name = models.get(model_id).name
    check_allowed(caller, name)
    return await _card(models, name)


async def _card(models: ModelEndpoints, name: str) -> ModelCard:
    return ModelCard(
        id=name, created=models.created, max_model_len=await models.max_model_len(name)
    )
