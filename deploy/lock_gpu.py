"""Print the GPU build's whole dependency tree pinned (constraints-gpu.txt; `make lock-gpu`).

pip resolves `.[gpu,dev]` for Linux x86_64 and Python 3.11 against PyPI alone (`--isolated`: this
machine's own indexes, wheel folders and constraints hold CPU builds), with the CPU lock's
versions as constraints, minus the CPU build's own packages; a constraint vLLM's CUDA build
refuses is dropped, named on stderr, and the resolution tried again. Nothing is installed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_ONLY = re.compile(r"^(torch|triton|vllm|intel|oneccl)|\+cpu", re.IGNORECASE)
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(39, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
    "any",
]
HEADER = """\
# The whole dependency tree of the GPU build (`pip install -c constraints-gpu.txt -e '.[gpu,dev]'`;
# cluster.yaml's nodes and the Kubernetes image install with it): Linux x86_64, Python 3.11, CUDA
# wheels from PyPI, the CPU lock's versions wherever vLLM's CUDA build allows them.
# Regenerate with `make lock-gpu` after changing pyproject.toml.
"""


def resolve(constraints: Path, report: Path) -> str | None:
    """None once resolved into `report`, else the constraint pip names in its conflict."""
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    with tempfile.TemporaryDirectory() as target:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "--isolated", "install", "--dry-run"]
            + ["--ignore-installed", "--report", str(report), "--target", target]
            + ["--index-url", "https://pypi.org/simple", "--python-version", "3.11"]
            + [*platforms, "--only-binary=:all:", "-c", str(constraints)]
            + [f"serviceai[gpu,dev] @ {ROOT.as_uri()}"],
            capture_output=True,
            text=True,
        )
    if done.returncode == 0:
        return None
    refused = re.search(r"The user requested \(constraint\) ([\w.-]+)==", done.stdout + done.stderr)
    if refused is None:
        sys.exit(done.stderr[-2000:])
    return refused.group(1)


def main() -> None:
    cpu = (ROOT / "constraints-cpu.txt").read_text().splitlines()
    kept = [line for line in cpu if "==" in line and not CPU_ONLY.search(line)]
    with tempfile.TemporaryDirectory() as scratch:
        constraints, report = Path(scratch, "constraints.txt"), Path(scratch, "report.json")
        while True:
            constraints.write_text("\n".join(kept) + "\n")
            refused = resolve(constraints, report)
            if refused is None:
                break
            print(f"the GPU build needs another {refused} than the CPU lock's", file=sys.stderr)
            kept = [line for line in kept if line.split("==")[0].lower() != refused.lower()]
        installed = json.loads(report.read_text())["install"]
    pins = sorted(
        (item["metadata"]["name"], item["metadata"]["version"])
        for item in installed
        if item["metadata"]["name"].lower() not in ("serviceai", "pip")
    )
    print(
        HEADER
        + "".join(
            f"{name}=={version}\n" for name, version in sorted(pins, key=lambda p: p[0].lower())
        ),
        end="",
    )


if __name__ == "__main__":
    main()
