"""Key scopes over model types and their LoRA adapters (`Type:adapter`)."""

from __future__ import annotations

import pytest

from app.accounts.keystore.schemas import KeyScopes
from app.accounts.scopes import check_models, covers, widened
from app.openai.errors import ApiError
from app.serving.adapters import check_adapter
from app.serving.pipeline import adapter_named


def test_a_types_scope_covers_its_adapters_an_adapters_scope_that_adapter_alone():
    assert covers(["T"], "T") and covers(["T"], "T:acme")
    assert covers(["T:acme"], "T:acme")
    assert not covers(["T:acme"], "T") and not covers(["T:acme"], "T:beta")
    assert not covers(["T"], "U:acme")


def test_an_adapter_of_a_known_type_may_be_scoped_an_unknown_types_may_not():
    check_models(KeyScopes(models=["T:anything"]), ["T", "U"])
    with pytest.raises(ApiError) as refused:
        check_models(KeyScopes(models=["V:acme"]), ["T", "U"])
    assert refused.value.param == "models"


def test_narrowing_a_type_to_one_of_its_adapters_is_no_widening():
    assert widened(KeyScopes(models=["T"]), KeyScopes(models=["T:acme"])) is None
    assert widened(KeyScopes(models=["T:acme"]), KeyScopes(models=["T"])) == "models"
    assert widened(KeyScopes(models=["T:acme"]), KeyScopes(models=["T:beta"])) == "models"


def test_a_model_names_an_adapter_of_the_type_it_resolved_to():
    assert adapter_named("T:acme", "T") == "T:acme"
    assert adapter_named("T", "T") is None
    assert adapter_named("claude-x:y", "T") is None  # an alias that resolved elsewhere
    check_adapter("T:acme", "T", ("T:acme",))
    with pytest.raises(ApiError) as unknown:
        check_adapter("T:gamma", "T", ("T:acme", "T:beta"))
    assert (unknown.value.status, unknown.value.code) == (404, "model_not_found")
    # No adapter is named: a key scoped to one adapter learns no other's (issue 70).
    assert "acme" not in unknown.value.message and "beta" not in unknown.value.message
    assert "GET /v1/models" in unknown.value.message
