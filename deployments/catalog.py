"""The logical model types the service offers: one place for what every deployment profile shares.

The serve configs (local and production) say how each type is served; what a type is (its
name, what it is for, which environment variable points it at another model) lives here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class LogicalModelType:
    name: str
    description: str
    model_env: str


LOGICAL_MODEL_TYPES: dict[str, LogicalModelType] = {
    t.name: t
    for t in (
        LogicalModelType(
            "ServiceAi-Fast",
            "Quick answers, simple chat, FAQ, translation; lowest latency and cost.",
            "SERVICEAI_MODEL_FAST",
        ),
        LogicalModelType(
            "ServiceAi-Pro",
            "Complex questions, reasoning, analytics, creative content; highest quality.",
            "SERVICEAI_MODEL_PRO",
        ),
        LogicalModelType(
            "ServiceAi-Coder",
            "Programming, code generation, code review, debugging, refactoring.",
            "SERVICEAI_MODEL_CODER",
        ),
        LogicalModelType(
            "ServiceAi-Embed",
            "Embeddings for search, retrieval, clustering and deduplication (/v1/embeddings).",
            "SERVICEAI_MODEL_EMBED",
        ),
    )
}
