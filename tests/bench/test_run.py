"""`python -m bench.run`'s options: what each server is started with (no server is started)."""

import json

import pytest

from app.config.service import ServiceConfig
from bench import run
from bench.servers import bare_command, bench_model_type, service_config, service_model_type
from deployments.deployment_options import serve_options

GPU_ENGINE = {
    "max_model_len": 2048,
    "max_num_seqs": 256,
    "dtype": "bfloat16",
    "kv_cache_memory_bytes": 17179869184,
    "max_num_batched_tokens": 8192,
}


def plan(*argv: str, gpu: bool = False):
    return run.run_plan(run.parser().parse_args(list(argv)), gpu)


def refusal(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        run.parser().parse_args(list(argv))
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_without_options_the_tiny_model_runs_as_make_bench_always_ran_it():
    spec, target = plan("serving")
    assert spec == run.SERVING
    assert target.model == "tiny" and not target.gpu
    profile = bench_model_type()
    assert target.engine_args == profile["engine_args"]
    ours = service_model_type(target)
    assert ours == {**profile, "model_env": None}  # only the model is pinned against the env
    assert "num_gpus_per_shard" not in ours


def test_the_concurrency_list_replaces_the_modes_runs_in_its_order():
    levels = "1:32,32:320,128:1024,256:1536"
    spec, target = plan("serving", "--model", "org/m", "--concurrency", levels)
    assert list(spec["concurrency"].items()) == [(1, 32), (32, 320), (128, 1024), (256, 1536)]
    assert (spec["input_len"], spec["output_len"]) == (64, 64)
    assert run.SERVING["concurrency"] == {1: 40, 8: 160, 32: 320}  # the spec itself is untouched
    assert target.max_concurrency == 256


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1:32,64", "'64' is not CONCURRENCY:PROMPTS"),
        ("a:b", "'a:b' is not CONCURRENCY:PROMPTS"),
        ("0:10", "'0:10': both numbers must be >= 1"),
        ("8:80,8:160", "concurrency 8 is given twice"),
    ],
)
def test_a_concurrency_list_of_anything_but_pairs_is_refused(capsys, value, message):
    err = refusal(capsys, "--concurrency", value)
    assert f"argument --concurrency: {message}" in err


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{max_model_len: 2048}", "not JSON: Expecting property name enclosed in double quotes"),
        ("[2048]", "must be a JSON object of engine arguments"),
        ('{"model": "org/m"}', "give the model with --model"),
    ],
)
def test_engine_args_must_be_a_json_object_without_the_model(capsys, value, message):
    assert f"argument --engine-args: {message}" in refusal(capsys, "--engine-args", value)


def test_on_a_gpu_node_both_servers_serve_the_operators_model_with_the_same_engine_args():
    _, target = plan(
        "serving",
        "--model",
        "org/m",
        "--engine-args",
        json.dumps(GPU_ENGINE),
        "--concurrency",
        "1:32,256:1536",
        gpu=True,
    )
    # vLLM's defaults plus the given args: none of the local profile's (eager, 512 MiB of KV)
    assert target.engine_args == GPU_ENGINE

    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    command = bare_command(target, 8100)
    assert command[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "org/m"]
    assert command[command.index("--served-model-name") + 1] == "ServiceAi-Fast"
    flags = command[command.index("--disable-uvicorn-access-log") + 1 :]
    vllm_serve = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())
    parsed = vllm_serve.parse_args(["--model", "m", *flags])
    assert (parsed.max_model_len, parsed.max_num_seqs, parsed.dtype) == (2048, 256, "bfloat16")
    assert (parsed.kv_cache_memory_bytes, parsed.max_num_batched_tokens) == (17179869184, 8192)

    # vLLM's several API servers over one engine: only the `vllm serve` command runs them
    from vllm.entrypoints.cli.serve import ServeSubcommand

    several = bare_command(target, 8100, api_servers=4)
    assert several[1:5] == ["-m", "bench.vllm_cli", "serve", "org/m"]
    vllm = FlexibleArgumentParser()
    serve = ServeSubcommand()
    serve.subparser_init(vllm.add_subparsers()).set_defaults(dispatch_function=serve.cmd)
    parsed = vllm.parse_args(several[3:])
    serve.validate(parsed)
    assert (parsed.model_tag, parsed.api_server_count, parsed.max_num_seqs) == ("org/m", 4, 256)

    [app] = service_config(target, 8000)["applications"]
    [ours] = ServiceConfig.model_validate(app["args"]).model_types
    assert ours.resolved_model({"SERVICEAI_MODEL_FAST": "other/model"}) == "org/m"
    assert ours.engine_args == GPU_ENGINE
    assert ours.tool_call_parser is None  # as bare vLLM: hermes is the tiny model's format
    assert ours.num_gpus_per_shard == 1
    assert serve_options(ours)["ray_actor_options"]["num_gpus"] == 1
    # every client reaches the engine at once, as with bare vLLM; none is refused by Serve's queue
    assert ours.max_ongoing_requests == 256 and ours.max_queued_requests >= 256


def test_the_services_ongoing_requests_stop_at_the_engines_max_num_seqs():
    engine = json.dumps({"max_num_seqs": 128})
    _, capped = plan("--model", "org/m", "--engine-args", engine, "--concurrency", "1:8,512:2048")
    assert service_model_type(capped)["max_ongoing_requests"] == 128
    _, free = plan("--model", "org/m", "--concurrency", "1:8,512:2048")
    assert service_model_type(free)["max_ongoing_requests"] == 512


def test_without_a_gpu_the_replica_asks_ray_for_none():
    _, target = plan("--model", "org/m", gpu=False)
    assert "num_gpus_per_shard" not in service_model_type(target)


def test_a_local_model_folder_is_given_to_both_servers_as_an_absolute_path(tmp_path, monkeypatch):
    (tmp_path / "m1b").mkdir()
    monkeypatch.chdir(tmp_path)
    _, target = plan("--model", "m1b")
    assert target.model == str(tmp_path / "m1b")
    assert bare_command(target, 8100)[4] == str(tmp_path / "m1b")
    assert service_model_type(target)["model"] == str(tmp_path / "m1b")


def test_extra_engine_args_go_on_top_of_the_tiny_models_profile():
    _, target = plan("--engine-args", '{"max_num_seqs": 32, "enforce_eager": false}')
    assert target.engine_args == {
        **bench_model_type()["engine_args"],
        "max_num_seqs": 32,
        "enforce_eager": False,
    }
    assert service_model_type(target)["max_ongoing_requests"] == 32
