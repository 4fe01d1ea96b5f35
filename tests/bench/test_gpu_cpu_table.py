"""bench/gpu/cpu_table.py: CPU per role from cpu_snap.py's samples, a role's processes apart."""

import importlib.util
from pathlib import Path

GPU = Path(__file__).resolve().parents[2] / "bench" / "gpu"
spec = importlib.util.spec_from_file_location("cpu_table", GPU / "cpu_table.py")
cpu_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_table)

PROCESSES = {  # pid: (command line, ticks used per second: 100 is one core)
    10: ("VLLM::EngineCore", 90),
    11: ("VLLM::APIServer_0", 40),
    12: ("VLLM::APIServer_1", 55),
    13: ("python3 -m vllm.entrypoints.cli.main serve /tmp/m1b --api-server-count 4", 1),
    20: ("ray::ServeReplica:serviceai:ServiceAi-Pro", 30),
    21: ("ray::ServeReplica:serviceai:ServiceAi-Pro", 35),
    22: ("ray::ServeReplica:serviceai:ServiceAi-Fast", 0),
}


def test_several_processes_of_a_role_show_their_sum_count_and_hottest(tmp_path):
    lines = []
    for second in range(4):
        lines.append(f"T {1000 + second}.000")
        for pid, (cmd, rate) in PROCESSES.items():
            lines.append(f"P {pid} {100 + rate * second} {cmd}")
    (tmp_path / "cpu_ours4-c256.txt").write_text("\n".join(lines) + "\n")
    shares = cpu_table.shares(tmp_path / "cpu_ours4-c256.txt")
    assert round(shares["bare API servers"]) == 95
    assert shares["bare API servers processes"] == (2, 55.0)
    assert round(shares["bare API server"]) == 1  # `vllm serve`'s launcher, idle
    assert "bare API server processes" not in shares
    assert shares["Pro replicas processes"] == (2, 35.0)
    table = cpu_table.table(tmp_path)
    assert "95% in 2 processes, hottest 55%" in table
    assert "65% in 2 processes, hottest 35%" in table
