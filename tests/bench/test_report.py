"""The benchmark's report: the Ray Serve LLM table and the README sections it rewrites."""

import json
from pathlib import Path

from bench import report

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"


def _metrics(tok_s: float, ttft: float) -> dict[str, float]:
    return {
        "output_throughput": tok_s,
        "median_ttft_ms": ttft,
        "p99_ttft_ms": 2 * ttft,
        "median_itl_ms": 1.5,
        "p99_itl_ms": 9.0,
    }


def _summary() -> dict:
    results = {}
    for c in (1, 32):
        results[f"bare-c{c}"] = _metrics(1000, 10)
        results[f"ours-c{c}"] = _metrics(800, 12)
        results[f"bare-ray-llm-c{c}"] = _metrics(2000, 20)
        results[f"ray-llm-c{c}"] = _metrics(500, 100)
    return {
        "date": "2026-11-22-0000",
        "machine": "2 cores",
        "rounds": 2,
        "spec": {"concurrency": {1: 40, 32: 320}},
        "contenders": ["ours", "ray-llm"],
        "results": results,
    }


def test_each_contender_is_compared_with_the_bare_runs_of_its_own_phase():
    summary = _summary()
    summary["results"]["bare-ray-llm-c32"]["front_end_us_per_token"] = 50.0
    summary["results"]["ray-llm-c32"]["front_end_us_per_token"] = 120.0
    table = report.ray_llm_table(summary)
    assert "| 32 | ServiceAi | 800 (0.80x) | 12.0 (1.20x) | 24.0 | 1.50 / 9.0 | - |" in table
    assert (
        "| 32 | Ray Serve LLM, defaults | 500 (0.25x) | 100.0 (5.00x) | 200.0 | 1.50 / 9.0 "
        "| 120 (2.40x) |"
    ) in table


def test_a_docs_section_is_replaced_between_its_own_markers(tmp_path):
    readme = tmp_path / "performance.md"
    readme.write_text(
        "intro\n<!-- bench:serving:start -->\nold serving\n<!-- bench:serving:end -->\n"
        "between\n<!-- bench:ray-llm:start -->\nold ray\n<!-- bench:ray-llm:end -->\nend\n"
    )
    report.update_doc(readme, _summary(), "new ray table\n", section="ray-llm")
    text = readme.read_text()
    assert "old serving" in text and "old ray" not in text
    assert "<!-- bench:ray-llm:start -->\nnew ray table\n\n<!-- bench:ray-llm:end -->" in text
    assert text.endswith("end\n")


def test_the_kept_ray_llm_run_renders_with_every_row():
    kept = json.loads((RESULTS / "2026-11-22-0950-serving.json").read_text())
    table = report.ray_llm_table(kept)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "server" not in line]
    assert len(rows) == 3 * 3  # three concurrencies x three servers


def test_engine_args_become_the_flags_vllm_serve_parses():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from bench.servers import engine_cli_args

    config = {
        "max_model_len": 2048,
        "enable_prefix_caching": True,
        "enforce_eager": False,
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = parser.parse_args(["--model", "m", *engine_cli_args(config)])
    assert parsed.max_model_len == 2048 and parsed.enable_prefix_caching
    assert parsed.structured_outputs_config.disable_any_whitespace


def test_front_end_cpu_per_token_is_reported_against_bare():
    summary = _summary()
    summary["spec"].update(input_len=64, output_len=64)
    for name in ("bare", "ours"):  # the budget reads c=8 too
        summary["results"][f"{name}-c8"] = dict(summary["results"][f"{name}-c32"])
    summary["results"]["bare-c32"]["front_end_us_per_token"] = 80.0
    summary["results"]["ours-c32"]["front_end_us_per_token"] = 200.0
    table = report.serving_table(summary)
    assert "c=32 200 vs 80 us (2.50x)" in table
    assert "c=1 " not in table.split("Front-end CPU")[1].split("\n")[0]  # not counted at c=1


def test_a_run_on_another_model_names_it_and_checks_only_the_budget_rows_it_ran():
    summary = _summary()
    summary["spec"] = {
        "input_len": 64,
        "output_len": 64,
        "concurrency": {1: 32, 32: 320, 256: 1536},
    }
    for name in ("bare", "ours"):
        summary["results"][f"{name}-c256"] = dict(summary["results"][f"{name}-c32"])
    summary |= {"model": "/tmp/m1b", "engine_args": {"max_model_len": 2048, "max_num_seqs": 256}}
    table = report.serving_table(summary)
    assert (
        'Model: /tmp/m1b; engine args of both servers: {"max_model_len": 2048, '
        '"max_num_seqs": 256}.'
    ) in table
    assert "| 256 | 1000 | 800 | 0.80 |" in table
    assert "- FAIL: output tok/s at c=32 >= 0.9x bare" in table
    assert "ITL p50 <= bare + 2 ms (c=1, 8, 32)" not in table  # no c=8 in this run


def test_the_machine_names_its_gpus(monkeypatch):
    monkeypatch.setattr(report, "gpu_names", lambda: ["NVIDIA H100 80GB HBM3"] * 2)
    assert ", 2x NVIDIA H100 80GB HBM3, Python " in report.machine()
    monkeypatch.setattr(report, "gpu_names", lambda: [])
    assert ", no GPU, Python " in report.machine()


def test_the_processes_table_sets_both_designs_against_bare_with_one_process():
    summary = _summary()
    r = summary["results"]
    r["bare-c32"]["us_per_token_by_process"] = {"api_server": 100.0}
    r["ours-p2-c32"] = _metrics(700, 14)
    r["bare-ours-p2-c32"] = _metrics(1000, 10)
    r["bare-a2-c32"] = {**_metrics(1100, 9), "front_end_us_per_token": 130.0}
    r["bare-a2-c32"]["us_per_token_by_process"] = {"api_server_1": 61.0, "api_server_2": 60.0}
    r["bare-bare-a2-c32"] = _metrics(1000, 10)
    table = report.processes_table(summary, 2)
    assert "| 32 | ours-p2 | 700 (0.70) | 14.0 (1.40) |" in table
    assert "| 32 | bare | 1000 (1.00) | 10.0 (1.00) | 9.0 (1.00) |  | api_server 100 |" in table
    assert (
        "| 32 | bare-a2 | 1100 (1.10) | 9.0 (0.90) | 9.0 (1.00) | 130 | api_server_1 61, "
        "api_server_2 60 |"
    ) in table
