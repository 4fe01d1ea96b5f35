"""Stored /v1/responses replies: saved after a turn, read back by their owner only, purged.

Every ingress replica reads and writes the same rows, so a conversation continues through any
of them. A response belongs to the user whose key made it; asked for by anyone else it does
not exist (404, never 403, so that ids cannot be probed). Rows expire `retention_s` after
they were made; expired rows are invisible at once and deleted by `purge`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import orjson
from sqlalchemy import delete, select

from app.accounts.keystore.database import Database
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.tables import StoredResponseRow

DEFAULT_RETENTION_S = 30 * 86400
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
MAX_PAGE = 100


class ResponseNotFound(KeyStoreError):
    status = 404
    code = "response_not_found"


class ResponseTooLarge(KeyStoreError):
    status = 400
    code = "response_too_large"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response as stored: the input the model saw (history included) and the reply body."""

    id: str
    user_id: str
    input_items: list[dict[str, Any]]
    body: dict[str, Any]

    def conversation(self) -> list[dict[str, Any]]:
        """What a next turn replays: this turn's input, then its output items."""
        return [*self.input_items, *self.body.get("output", ())]


@dataclass(frozen=True, slots=True)
class ItemPage:
    """One page of a response's input items, in the order asked for."""

    data: list[dict[str, Any]]
    has_more: bool

    def as_list(self) -> dict[str, Any]:
        return {
            "object": "list",
            "data": self.data,
            "first_id": self.data[0]["id"] if self.data else None,
            "last_id": self.data[-1]["id"] if self.data else None,
            "has_more": self.has_more,
        }


def now() -> datetime:
    return datetime.now(UTC)


class ResponseStore:
    def __init__(
        self,
        database: Database,
        *,
        retention_s: float = DEFAULT_RETENTION_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.database = database
        self.retention_s = retention_s
        self.max_bytes = max_bytes

    def check_size(self, input_items: list[dict[str, Any]], param: str = "input") -> None:
        """Refuse up front an input that alone would not fit in a stored response."""
        size = len(orjson.dumps(input_items))
        if size > self.max_bytes:
            raise ResponseTooLarge(
                f"The conversation is {size} bytes, more than a stored response may hold "
                f"({self.max_bytes} bytes). Start a new conversation, or send store=false.",
                param=param,
            )

    async def save(
        self, user_id: str, input_items: list[dict[str, Any]], body: dict[str, Any]
    ) -> None:
        """Store a finished response (its `id` is the body's); ResponseTooLarge over the cap."""
        encoded_input = orjson.dumps(input_items).decode()
        encoded_body = orjson.dumps(body).decode()
        size = len(encoded_input) + len(encoded_body)
        if size > self.max_bytes:
            raise ResponseTooLarge(
                f"The response and its input are {size} bytes, more than a stored response "
                f"may hold ({self.max_bytes} bytes).",
                param="store",
            )
        created = now()
        async with self.database.transaction() as session:
            session.add(
                StoredResponseRow(
                    id=body["id"],
                    user_id=user_id,
                    created_at=created,
                    expires_at=created + timedelta(seconds=self.retention_s),
                    size_bytes=size,
                    input_items=encoded_input,
                    body=encoded_body,
                )
            )

    async def get(
        self, user_id: str, response_id: str, *, param: str | None = None
    ) -> StoredResponse:
        """The caller's unexpired response, else ResponseNotFound (also for others' ids)."""
        query = select(StoredResponseRow).where(
            StoredResponseRow.id == response_id,
            StoredResponseRow.user_id == user_id,
            StoredResponseRow.expires_at > now(),
        )
        async with self.database.transaction() as session:
            row = await session.scalar(query)
        if row is None:
            raise not_found(response_id, param)
        return StoredResponse(
            id=row.id,
            user_id=row.user_id,
            input_items=orjson.loads(row.input_items),
            body=orjson.loads(row.body),
        )

    async def delete(self, user_id: str, response_id: str) -> None:
        statement = delete(StoredResponseRow).where(
            StoredResponseRow.id == response_id,
            StoredResponseRow.user_id == user_id,
            StoredResponseRow.expires_at > now(),
        )
        async with self.database.transaction() as session:
            deleted = (await session.execute(statement)).rowcount
        if not deleted:
            raise not_found(response_id, None)

    async def input_items(
        self,
        user_id: str,
        response_id: str,
        *,
        limit: int = 20,
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> ItemPage:
        """A page of the input items of a response (history included), `after` an item id."""
        items = (await self.get(user_id, response_id)).input_items
        if order == "desc":
            items = items[::-1]
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise KeyStoreError(
                    f"'after' names no input item of response '{response_id}': '{after[:64]}'.",
                    param="after",
                )
            items = items[ids.index(after) + 1 :]
        return ItemPage(data=items[:limit], has_more=len(items) > limit)

    async def purge(self) -> int:
        """Delete every expired response; how many were deleted."""
        statement = delete(StoredResponseRow).where(StoredResponseRow.expires_at <= now())
        async with self.database.transaction() as session:
            return (await session.execute(statement)).rowcount


def not_found(response_id: str, param: str | None) -> ResponseNotFound:
    return ResponseNotFound(f"No response with id '{response_id[:64]}'.", param=param)
