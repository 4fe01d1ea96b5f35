"""The service's one version, the package's (pyproject.toml): the OpenAPI document,
`serviceai --version`, the Helm chart's version and image tag and CHANGELOG.md's latest entry
all carry it (tests/test_release.py holds them together)."""

from importlib.metadata import version

VERSION = version("serviceai")
