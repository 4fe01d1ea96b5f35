"""The Node.js clients people use, pinned in tests/e2e/node/package.json: the Vercel AI SDK
(`toolChoice: "required"`, `generateObject`) and the official openai client (structured
outputs and a forced call, whole and streamed), each reply through `JSON.parse` and a zod
schema. Before strict JSON strings the AI SDK's forced calls failed with
`AI_ToolChoiceViolationError` on the random model."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.conftest import Stack

NODE_CLIENTS = Path(__file__).with_name("node")


def test_the_vercel_ai_sdk_and_the_openai_node_client_read_every_json_reply(stack: Stack):
    result = subprocess.run(
        ["node", "clients.mjs"],
        cwd=NODE_CLIENTS,
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "SERVICEAI_BASE_URL": stack.base_url,
            "SERVICEAI_API_KEY": stack.api_key,
            "AI_SDK_LOG_WARNINGS": "false",
        },
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert result.returncode == 0 and not summary["failures"], summary["failures"] or result.stderr
    assert summary["checks"] == 30
