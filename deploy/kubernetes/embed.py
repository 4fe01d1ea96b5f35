"""Write serve_config.production.yaml into the RayService's serveConfigV2, verbatim.

python deploy/kubernetes/embed.py          # rewrites deploy/kubernetes/base/rayservice.yaml
python deploy/kubernetes/embed.py --check  # exit 1 where the two differ
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVE_CONFIG = ROOT / "serve_config.production.yaml"
RAYSERVICE = Path(__file__).resolve().parent / "base" / "rayservice.yaml"
OPENING = "  serveConfigV2: |\n"
CLOSING = "  rayClusterConfig:\n"


def embedded(manifest: str, config: str) -> str:
    """`manifest` with `config` as its serveConfigV2 block (indented four spaces)."""
    head, _, rest = manifest.partition(OPENING)
    _, _, tail = rest.partition(CLOSING)
    block = "".join(f"    {line}" if line.strip() else "\n" for line in config.splitlines(True))
    return head + OPENING + block + CLOSING + tail


def main() -> int:
    manifest = RAYSERVICE.read_text()
    wanted = embedded(manifest, SERVE_CONFIG.read_text())
    if "--check" in sys.argv[1:]:
        if wanted != manifest:
            print(f"{RAYSERVICE} is stale: run python deploy/kubernetes/embed.py", file=sys.stderr)
            return 1
        return 0
    RAYSERVICE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
