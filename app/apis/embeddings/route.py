"""POST /v1/embeddings: vectors of an embedding type, with the same keys, plans and usage."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response

from app.accounts.auth import Caller, authenticate
from app.apis.chat.route import ERRORS
from app.apis.embeddings.call import EmbeddingsCall
from app.apis.embeddings.protocol import EmbeddingList, EmbeddingRequest
from app.serving.pipeline import serve

router = APIRouter()


@router.post("/v1/embeddings", response_model=EmbeddingList, responses=ERRORS)
async def create_embeddings(
    body: EmbeddingRequest, request: Request, caller: Caller = Depends(authenticate)
) -> Response:
    return await serve(request, caller, EmbeddingsCall(body))
