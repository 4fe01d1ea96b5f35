"""One version: the package's, carried by the CLI, the OpenAPI document, the Kubernetes example's
image tag and the changelog."""

from __future__ import annotations

import tomllib

import httpx
import yaml
from typer.testing import CliRunner

from app.accounts.auth import KeyVerifier
from app.cli.main import cli
from app.config.settings import PROJECT_ROOT
from app.http.app import create_api
from app.limits.usage_meter import UsageMeter
from app.serving.endpoints import ModelEndpoints
from app.version import VERSION
from tests.app.conftest import shipped_limits

PACKAGE_VERSION = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_installed_package_is_the_projects_version():
    assert VERSION == PACKAGE_VERSION


def test_the_cli_says_its_version():
    printed = CliRunner().invoke(cli, ["--version"])
    assert printed.exit_code == 0 and printed.output.strip() == f"serviceai {VERSION}"


async def test_the_openapi_document_carries_the_version(store):
    app = create_api(
        ModelEndpoints({}, created=0), KeyVerifier(store), shipped_limits(), UsageMeter(store)
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get("/openapi.json")).json()["info"]["version"] == VERSION


def test_the_helm_chart_and_its_example_deploy_this_version():
    chart = yaml.safe_load((PROJECT_ROOT / "deploy/kubernetes/serviceai/Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == VERSION  # the image tag by default
    example = yaml.safe_load((PROJECT_ROOT / "deploy/kubernetes/values/example.yaml").read_text())
    assert example["image"]["tag"] == VERSION


def test_the_changelog_has_an_entry_for_this_version_and_the_license_is_apache():
    changelog = (PROJECT_ROOT / "CHANGELOG.md").read_text()
    assert f"\n## {VERSION}\n" in changelog
    assert "Apache License" in (PROJECT_ROOT / "LICENSE").read_text()
