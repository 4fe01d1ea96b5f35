"""The service's one version, the package's (pyproject.toml): the OpenAPI document,
`serviceai --version`, the image tag of the Kubernetes example and CHANGELOG.md's latest entry
all carry it (tests/test_release.py holds them together)."""

from importlib.metadata import version

VERSION = version("serviceai")
