"""One HTTP exchange with an ASGI app driven by hand: the request body arrives as the test
scripts it, and the log keeps, in order, each piece the app read and each message it sent."""

from __future__ import annotations

import asyncio
from typing import Literal

from starlette.types import ASGIApp, Message


def http_scope(path: str = "/v1/chat/completions", *headers: tuple[str, str]) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
    }


class Exchange:
    """`pieces` of body, then the body ends (`"end"`), or the client stops sending mid-body and
    waits (`"stall"`) or leaves (`"leave"`)."""

    def __init__(self, pieces: list[bytes], then: Literal["end", "stall", "leave"] = "end") -> None:
        self._pieces = list(pieces)
        self._then = then
        self.log: list[tuple[str, Message]] = []

    async def receive(self) -> Message:
        if self._pieces:
            piece = self._pieces.pop(0)
            more = bool(self._pieces) or self._then != "end"
            message = {"type": "http.request", "body": piece, "more_body": more}
            self.log.append(("read", message))
            return message
        if self._then == "stall":
            await asyncio.Event().wait()
        message = {"type": "http.disconnect"}
        self.log.append(("read", message))
        return message

    async def send(self, message: Message) -> None:
        self.log.append(("sent", message))

    async def run(self, app: ASGIApp, scope: dict, timeout_s: float = 10) -> None:
        async with asyncio.timeout(timeout_s):
            await app(scope, self.receive, self.send)

    @property
    def status(self) -> int:
        return next(m["status"] for kind, m in self.log if m["type"] == "http.response.start")

    @property
    def answer(self) -> bytes:
        sent = [m for _, m in self.log if m["type"] == "http.response.body"]
        return b"".join(m.get("body", b"") for m in sent)

    def bytes_read(self) -> int:
        return sum(len(m.get("body", b"")) for kind, m in self.log if kind == "read")

    def reads_before_answer(self) -> int:
        """Pieces read before the answer's bytes (all of them) were sent."""
        reads = 0
        for kind, message in self.log:
            if kind == "read" and message["type"] == "http.request":
                reads += 1
            if message["type"] == "http.response.body" and message.get("body"):
                return reads
        raise AssertionError("no answer was sent")

    def ended_after_the_last_read(self) -> bool:
        last_read = max(i for i, (kind, _) in enumerate(self.log) if kind == "read")
        end = next(
            i
            for i, (_, m) in enumerate(self.log)
            if m["type"] == "http.response.body" and not m.get("more_body", False)
        )
        return end > last_read
