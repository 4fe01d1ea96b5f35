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
from sqlalchemy import delete, func, select, update

from app.accounts.keystore.database import Database, rowcount
from app.accounts.keystore.errors import KeyStoreError
from app.accounts.keystore.tables import StoredResponseRow

UNFINISHED = ("queued", "in_progress")
"""A background response's statuses before it ends; a conversation continues from no such one."""
DEFAULT_RETENTION_S = 30 * 86400
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_USER_MAX_BYTES = 256 * 1024 * 1024
MAX_PAGE = 100


class ResponseNotFound(KeyStoreError):
    status = 404
    code = "response_not_found"


class ResponseTooLarge(KeyStoreError):
    status = 400
    code = "response_too_large"


class StoredResponsesFull(KeyStoreError):
    status = 400
    code = "stored_responses_limit_reached"


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """A response as stored: the input the model saw (history included) and the reply body."""

    id: str
    user_id: str
    input_items: list[dict[str, Any]]
    body: dict[str, Any]
    status: str = "completed"

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
        user_max_bytes: int = DEFAULT_USER_MAX_BYTES,
    ) -> None:
        self.database = database
        self.retention_s = retention_s
        self.max_bytes = max_bytes
        self.user_max_bytes = user_max_bytes

    async def check_room(self, user_id: str) -> None:
        """Refuse (StoredResponsesFull) while the user's unexpired stored responses hold
        `user_max_bytes` or more: checked before a reply is generated and as it is stored, so
        a user holds at most that and the responses being stored at that moment."""
        query = select(func.coalesce(func.sum(StoredResponseRow.size_bytes), 0)).where(
            StoredResponseRow.user_id == user_id, StoredResponseRow.expires_at > now()
        )
        async with self.database.transaction() as session:
            held = int(await session.scalar(query) or 0)
        if held >= self.user_max_bytes:
            raise StoredResponsesFull(
                f"Your stored responses hold {held} bytes; a user may keep "
                f"{self.user_max_bytes}. Delete some (DELETE /v1/responses/{{id}}), wait for "
                "them to expire, or send store=false.",
                param="store",
            )

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
        """Store a response (its `id` is the body's): a finished one, or a background one as
        it starts (status `queued`); ResponseTooLarge over the cap."""
        encoded_input = orjson.dumps(input_items).decode()
        encoded_body = orjson.dumps(body).decode()
        size = self._size(len(encoded_input) + len(encoded_body))
        await self.check_room(user_id)
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
                    status=body.get("status", "completed"),
                )
            )

    async def finish(self, user_id: str, body: dict[str, Any], input_bytes: int) -> bool:
        """A background response's end (its body, whose status ends it); False when it had
        already ended (cancelled), which this leaves as it is."""
        encoded_body = orjson.dumps(body).decode()
        size = self._size(input_bytes + len(encoded_body))
        return await self._move(
            user_id,
            body["id"],
            UNFINISHED,
            status=body.get("status", "completed"),
            body=encoded_body,
            size_bytes=size,
        )

    async def start(self, user_id: str, response_id: str) -> bool:
        """A queued background response is now generated."""
        return await self._move(user_id, response_id, ("queued",), status="in_progress")

    async def cancel(self, user_id: str, response_id: str) -> StoredResponse:
        """Cancel a background response that has not ended (one that has stays as it is);
        the response as it now is. Another kind of response cannot be cancelled (400)."""
        stored = await self.get(user_id, response_id)
        if not stored.body.get("background"):
            raise KeyStoreError(
                f"Response '{response_id[:64]}' was not created in the background: only a "
                "background response can be cancelled.",
                param="response_id",
            )
        if await self._move(user_id, response_id, UNFINISHED, status="cancelled"):
            return await self.get(user_id, response_id)
        return stored

    async def status(self, user_id: str, response_id: str) -> str | None:
        """Where a response stands (None once it is gone): a background run's cancel watch."""
        query = select(StoredResponseRow.status).where(
            StoredResponseRow.id == response_id, StoredResponseRow.user_id == user_id
        )
        async with self.database.transaction() as session:
            return await session.scalar(query)

    async def _move(
        self, user_id: str, response_id: str, from_statuses: tuple[str, ...], **values: Any
    ) -> bool:
        """One conditional UPDATE: whether the response was in one of `from_statuses`."""
        statement = (
            update(StoredResponseRow)
            .where(
                StoredResponseRow.id == response_id,
                StoredResponseRow.user_id == user_id,
                StoredResponseRow.status.in_(from_statuses),
            )
            .values(**values)
        )
        async with self.database.transaction() as session:
            return rowcount(await session.execute(statement)) > 0

    def _size(self, size: int) -> int:
        if size > self.max_bytes:
            raise ResponseTooLarge(
                f"The response and its input are {size} bytes, more than a stored response "
                f"may hold ({self.max_bytes} bytes).",
                param="store",
            )
        return size

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
        body = orjson.loads(row.body)
        if row.status in (*UNFINISHED, "cancelled"):  # moved on without its body
            body["status"] = row.status
        return StoredResponse(
            id=row.id,
            user_id=row.user_id,
            input_items=orjson.loads(row.input_items),
            body=body,
            status=row.status,
        )

    async def delete(self, user_id: str, response_id: str) -> None:
        statement = delete(StoredResponseRow).where(
            StoredResponseRow.id == response_id,
            StoredResponseRow.user_id == user_id,
            StoredResponseRow.expires_at > now(),
        )
        async with self.database.transaction() as session:
            deleted = rowcount(await session.execute(statement))
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
            return rowcount(await session.execute(statement))


def not_found(response_id: str, param: str | None) -> ResponseNotFound:
    return ResponseNotFound(f"No response with id '{response_id[:64]}'.", param=param)
