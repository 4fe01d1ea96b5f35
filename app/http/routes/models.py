"""GET /v1/models and /v1/models/{id}: the logical model types (with their context length),
never the concrete models."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from app.accounts.auth import Caller, authenticate
from app.openai.protocol import ErrorResponse, ModelCard, ModelList
from app.serving.adapters import adapters_of, check_adapter
from app.serving.endpoints import ModelEndpoints
from app.serving.pipeline import adapter_named, check_allowed

router = APIRouter()


@router.get("/v1/models", response_model=ModelList, responses={401: {"model": ErrorResponse}})
async def list_models(request: Request, caller: Caller = Depends(authenticate)) -> ModelList:
    """The types, each followed by its LoRA adapters (`Type:adapter`), that the key may call."""
    models: ModelEndpoints = request.app.state.models
    cards = []
    for name in models.names:
        for model in [name, *await adapters_of(models, request.app.state.adapters, name)]:
            if caller.may_call(model):
                cards.append(await _card(models, name, model))
    return ModelList(data=cards)


@router.get(
    "/v1/models/{model_id}",
    response_model=ModelCard,
    responses={401: {"model": ErrorResponse}, 404: {"model": ErrorResponse}},
)
async def retrieve_model(
    model_id: str, request: Request, caller: Caller = Depends(authenticate)
) -> ModelCard:
    models: ModelEndpoints = request.app.state.models
    name = models.get(model_id, caller.models).name
    adapter = adapter_named(model_id, name)
    check_allowed(caller, adapter or name)  # before the adapter's 404: a scope names no other
    if adapter is not None:
        held = await adapters_of(models, request.app.state.adapters, name)
        check_adapter(adapter, name, tuple(held))
    return await _card(models, name, adapter or name)


async def _card(models: ModelEndpoints, name: str, model: str) -> ModelCard:
    """The card of a type (`model` its name) or of one of its adapters."""
    return ModelCard(
        id=model, created=models.created, max_model_len=await models.max_model_len(name)
    )
