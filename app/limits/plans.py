"""Plans: what each plan allows per model type. Configured under `plans:` in serve_config.yaml.

A user's plan is a name in the key store (`users.plan`); the limits behind the name live here,
so changing a plan's numbers is a config change, and moving a user is a store change.
"""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    RootModel,
    field_validator,
    model_validator,
)

from app.accounts.keystore.schemas import PlanName


class ModelTypeLimits(BaseModel):
    """One plan's limits on one model type, per user (all of the user's keys together)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int = Field(ge=1)
    tokens_per_minute: int = Field(ge=1, description="Prompt plus completion tokens.")
    concurrent_requests: int = Field(ge=1, description="Requests in flight at once.")
    tokens_per_day: int = Field(
        ge=1, description="Daily quota of prompt plus completion tokens, per UTC day."
    )
    inputs_per_request: int = Field(
        2048, ge=1, le=2048, description="Inputs in one /v1/embeddings request (OpenAI's: 2048)."
    )
    input_tokens_per_request: int = Field(
        300_000,
        ge=1,
        description="Tokens of all the inputs of one /v1/embeddings request together "
        "(OpenAI's: 300,000).",
    )


PRIORITY_KEY = "priority"
DEFAULT_PRIORITY = 0


class Plan(RootModel[dict[str, ModelTypeLimits]]):
    """The limits of a plan by model type name, and (under the key `priority`) the plan's
    priority in the engines: lower is served first, as vLLM orders requests."""

    model_config = ConfigDict(frozen=True)
    _priority: int = PrivateAttr(DEFAULT_PRIORITY)

    @model_validator(mode="wrap")
    @classmethod
    def _with_priority(cls, data: Any, handler: Any) -> Plan:
        priority = DEFAULT_PRIORITY
        if isinstance(data, dict) and PRIORITY_KEY in data:
            data = dict(data)
            priority = data.pop(PRIORITY_KEY)
            if type(priority) is not int or not 0 <= priority <= 1000:
                raise ValueError(
                    f"a plan's priority is a whole number from 0 (first) to 1000, not {priority!r}"
                )
        plan = handler(data)
        plan._priority = priority
        return plan

    @property
    def priority(self) -> int:
        return self._priority

    def on(self, model_type: str) -> ModelTypeLimits:
        return self.root[model_type]


class Plans(RootModel[dict[PlanName, Plan]]):
    """Every plan by name. Each must give limits for every model type the service serves."""

    model_config = ConfigDict(frozen=True)

    @field_validator("root")
    @classmethod
    def _some_plan(cls, value: dict[str, Plan]) -> dict[str, Plan]:
        if not value:
            raise ValueError("at least one plan is needed (e.g. free)")
        return value

    def check_covers(self, model_types: list[str]) -> None:
        """Raise ValueError naming a plan that gives no limits for a served model type.

        Limits for types this application does not serve are allowed: a config that serves
        a subset of the types keeps the full plans (a misspelt type shows up as missing).
        """
        for name, plan in self.root.items():
            missing = [t for t in model_types if t not in plan.root]
            if missing:
                raise ValueError(
                    f"plan '{name}' gives no limits for model types {missing} "
                    f"(it has: {sorted(plan.root)})"
                )

    def get(self, name: str) -> Plan | None:
        return self.root.get(name)

    @property
    def names(self) -> list[str]:
        return list(self.root)
