"""The `args` of the ServiceAi application in serve_config.yaml, validated at start."""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from app.accounts.keystore.schemas import DEFAULT_PLAN
from app.limits.plans import Plans
from deployments.catalog import LOGICAL_MODEL_TYPES
from deployments.model_type import AutoscalingOptions, ModelTypeConfig


class IngressConfig(BaseModel):
    """The HTTP edge: authentication, limits and dispatch. Light on CPU, mostly awaiting."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int | None = Field(None, ge=1)
    autoscaling_config: AutoscalingOptions = None
    num_cpus: float = Field(0.25, ge=0)
    resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources per replica, e.g. a marker that only the CPU node type "
        "of the cluster offers, so that no ingress replica lands on (and holds) a GPU node.",
    )
    max_ongoing_requests: int = Field(1024, ge=1)
    env_vars: dict[str, str] = Field(
        default_factory=dict,
        description="Environment of the ingress replicas (SERVICEAI_* settings). Ray expands "
        "${VAR} from the node's environment, so secrets stay out of this file.",
    )
    graceful_shutdown_timeout_s: float = Field(
        20.0, ge=0, description="How long a stopping replica may finish its streams."
    )
    max_surge_percent: int = Field(
        0, ge=0, le=100, description="Extra replicas during a rollout, as for model types."
    )

    @model_validator(mode="after")
    def _replicas_or_autoscaling(self) -> IngressConfig:
        if self.num_replicas is not None and self.autoscaling_config is not None:
            raise ValueError("set either num_replicas or autoscaling_config, not both")
        return self

    def most_replicas(self) -> int:
        """The most ingress replicas that may run at once (a rollout's extra ones included)."""
        most = self.num_replicas or (self.autoscaling_config or {}).get("max_replicas", 1)
        return most + math.ceil(most * self.max_surge_percent / 100)

    def serve_options(self) -> dict[str, Any]:
        options: dict[str, Any] = {
            "name": "Ingress",
            "max_ongoing_requests": self.max_ongoing_requests,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "max_surge_percent": self.max_surge_percent,
            "ray_actor_options": {"num_cpus": self.num_cpus},
            # One JSON object a line: the access log's fields (app/observability) are keys.
            "logging_config": {"encoding": "JSON"},
        }
        if self.resources:
            options["ray_actor_options"]["resources"] = dict(self.resources)
        if self.env_vars:
            options["ray_actor_options"]["runtime_env"] = {"env_vars": dict(self.env_vars)}
        if self.autoscaling_config is not None:
            options["autoscaling_config"] = dict(self.autoscaling_config)
        else:
            options["num_replicas"] = self.num_replicas or 1
        return options


class ServiceConfig(BaseModel):
    """Everything under `args:` of the application."""

    model_config = ConfigDict(extra="forbid")

    ingress: IngressConfig = Field(default_factory=IngressConfig)
    models_app: str | None = Field(
        None,
        description="Serve the model types deployed by this other application instead of "
        "deploying them here: an extra ingress (another database, more replicas) over the "
        "same engines.",
    )
    plans: Plans = Field(
        description="Rate limits and daily quotas by plan name, then by model type. A user's plan "
        f"is named in the key store; '{DEFAULT_PLAN}' (the plan of a new user) must be here.",
    )
    separate_model_apps: bool = Field(
        False,
        description="Each model type runs as its own application, named after the type and "
        "built by `app.builder:build_model_type`; this application holds the ingress only. "
        "Serve restarts every deployment of an application whose args change, so this keeps a "
        "change to one type (a new model, new autoscaling) from restarting the others.",
    )
    # After models_app and separate_model_apps: whether a bare name will do depends on them.
    model_types: list[ModelTypeConfig] = Field(
        min_length=1,
        description="Each type's whole entry; where another application deploys the types "
        "(separate_model_apps, models_app) their names will do, and keep this application's "
        "args, hence its replicas, unchanged when a type's entry changes.",
    )

    model_aliases: dict[str, str] = Field(
        default_factory=dict,
        description="Other names a request's `model` may use for a model type: a name, or a "
        "shell-style pattern ('claude-*haiku*'), mapped to the type's name; the first that "
        "matches, in order, wins. Clients with model ids of their own (Claude Code's "
        "`claude-...`) then reach a type without a change; any other name stays a 404.",
    )

    @model_validator(mode="after")
    def _aliases_name_model_types(self) -> ServiceConfig:
        # A logical type this config leaves out (a smaller local setup) keeps its aliases: a
        # request by one of them is a 404, as by the type's own name.
        names = {m.name for m in self.model_types} | set(LOGICAL_MODEL_TYPES)
        for alias, target in self.model_aliases.items():
            if target not in names:
                raise ValueError(
                    f"model_aliases: {alias!r} names {target!r}, which is not a model type "
                    f"(types: {', '.join(sorted(names))})"
                )
            if alias in names:
                raise ValueError(f"model_aliases: {alias!r} is a model type's own name")
        return self

    @model_validator(mode="after")
    def _one_place_for_the_models(self) -> ServiceConfig:
        if self.models_app is not None and self.separate_model_apps:
            raise ValueError("set either models_app or separate_model_apps, not both")
        return self

    @model_validator(mode="after")
    def _engines_in_one_ingress(self) -> ServiceConfig:
        local = [m.name for m in self.model_types if m.in_ingress]
        if not local:
            return self
        if not self.deploys_model_types():
            raise ValueError(
                f"in_ingress ({', '.join(local)}) runs the engine in this application's "
                "ingress: not with models_app or separate_model_apps"
            )
        ingress = self.ingress
        if ingress.autoscaling_config is not None or (ingress.num_replicas or 1) != 1:
            raise ValueError(
                f"in_ingress ({', '.join(local)}) runs one engine in the ingress's replica: "
                "the ingress needs num_replicas: 1"
            )
        return self

    def ingress_options(self) -> dict[str, Any]:
        """The ingress deployment's options, with the resources of the engines it runs."""
        options = self.ingress.serve_options()
        actor = options["ray_actor_options"]
        for model_type in self.model_types:
            for name, value in model_type.ingress_resources().items():
                if name == "accelerator_type":
                    actor[name] = value
                else:
                    actor[name] = actor.get(name, 0) + value
        return options

    @model_validator(mode="after")
    def _plans_cover_the_model_types(self) -> ServiceConfig:
        self.plans.check_covers([m.name for m in self.model_types])
        if self.plans.get(DEFAULT_PLAN) is None:
            raise ValueError(f"plans must include '{DEFAULT_PLAN}', the plan of a new user")
        return self

    def deploys_model_types(self) -> bool:
        """Whether this application deploys the model types itself (else it is ingress only)."""
        return self.models_app is None and not self.separate_model_apps

    def model_type_app(self, name: str) -> str | None:
        """The application that runs model type `name`; None when it is this one."""
        return name if self.separate_model_apps else self.models_app

    @field_validator("model_types", mode="before")
    @classmethod
    def _names_where_another_app_deploys(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, list):
            return value
        names = [m for m in value if isinstance(m, str)]
        if not names:
            return value
        if not info.data.get("separate_model_apps") and info.data.get("models_app") is None:
            raise ValueError(
                f"{names[0]!r} is a name only; this application deploys its model types, so "
                "each needs its whole entry (names only with separate_model_apps or models_app)"
            )
        return [{"name": m} if isinstance(m, str) else m for m in value]

    @field_validator("model_types")
    @classmethod
    def _unique_names(cls, value: list[ModelTypeConfig]) -> list[ModelTypeConfig]:
        names = [m.name for m in value]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model type names must be unique; repeated: {duplicates}")
        if "Ingress" in names:
            raise ValueError("'Ingress' is reserved for the ingress deployment")
        return value

    def scale_to_zero_types(self) -> frozenset[str] | None:
        """Model types allowed to have no replica (min_replicas 0): requests wait for a cold start.

        None where another application deploys the types: its args decide, and Serve tells
        each handle (app.serving.dispatch.scales_to_zero), whatever entries this config repeats.
        """
        if not self.deploys_model_types():
            return None
        return frozenset(
            m.name
            for m in self.model_types
            if m.autoscaling_config is not None and m.autoscaling_config.get("min_replicas", 1) == 0
        )
