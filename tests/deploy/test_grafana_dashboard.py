"""docs/grafana/serviceai.json parses, and every query reads a series the service registers.

tests/e2e/test_observability.py checks the same names against a live Ray metrics endpoint.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

from ray.util.metrics import Metric
from vllm.v1.metrics import loggers as vllm_loggers

from app.observability import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "serviceai.json"
_NAME = re.compile(r"\bray_[A-Za-z0-9_]+")
_SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def metric_names(dashboard: dict) -> set[str]:
    """The Prometheus series every panel's queries read."""
    return {
        name
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for name in _NAME.findall(target["expr"])
    }


def registered(name: str) -> str:
    """The name a series was registered under, before Ray's prefix and Prometheus's suffixes."""
    name = name.removeprefix("ray_")
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name


def ours() -> set[str]:
    return {m._name for m in vars(metrics).values() if isinstance(m, Metric)}


def vllms() -> set[str]:
    source = inspect.getsource(vllm_loggers)
    return {n.replace(":", "_") for n in re.findall(r'name="(vllm:[a-z_]+)"', source)}


def test_the_dashboard_parses_and_every_panel_queries_something():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "serviceai"
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert _NAME.search(target["expr"]), (panel["title"], target["expr"])
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


def test_every_series_is_one_the_service_or_its_engines_export():
    names = {registered(n) for n in metric_names(json.loads(DASHBOARD.read_text()))}
    unknown = {
        n for n in names if n not in ours() and n not in vllms() and not n.startswith("serve_")
    }
    assert not unknown
    # Every series of ours is on the dashboard.
    assert ours() <= names
