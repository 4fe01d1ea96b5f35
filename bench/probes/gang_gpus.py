"""Where Serve puts the members of a gang that each reserve a fraction of a GPU (issue 56).

    .venv/bin/python -m bench.probes.gang_gpus [--fraction 0.5] [--gang-size 2] [--replicas 4]
        [--occupied 0.5]

The design of several serving processes per engine as a gang (bench/NOTES.md, "Issue 56's next
design") gives each member 1/N of the engine's GPU, and rank 0 launches the engine core on the
GPU its members share. This starts a Ray cluster of its own with four GPUs counted (none need
exist: Ray hands out GPU ids from the count and sets CUDA_VISIBLE_DEVICES from them), deploys a
gang-scheduled deployment whose replicas reserve `--fraction` of a GPU each, and prints each
member's gang, rank and GPU ids: the members of one gang on one GPU is what the design needs.
`--occupied F` first starts an actor that holds F of a GPU, as another engine would: a gang then
has a GPU with less than its share free beside whole free ones.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import ray
from ray import serve

GPUS = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fraction", type=float, default=0.5, help="a member's share of a GPU")
    parser.add_argument("--gang-size", type=int, default=2)
    parser.add_argument("--replicas", type=int, default=4, help="a multiple of the gang size")
    parser.add_argument("--occupied", type=float, default=0.0, help="a GPU share held before")
    parser.add_argument("--gpus", type=int, default=GPUS, help="GPUs the node counts")
    args = parser.parse_args()
    ray.init(
        address="local",  # never a cluster already running here
        num_cpus=GPUS,
        num_gpus=args.gpus,
        include_dashboard=False,
        _temp_dir=tempfile.mkdtemp(prefix="gang-"),
    )
    serve.start(http_options={"host": "127.0.0.1", "port": 0})
    holder = None
    if args.occupied:

        @ray.remote(num_cpus=0, num_gpus=args.occupied)
        class Holder:
            def gpu_ids(self) -> list:
                return ray.get_gpu_ids()

        holder = Holder.remote()
        print(json.dumps({"holder_gpu_ids": ray.get(holder.gpu_ids.remote())}))

    @serve.deployment(
        num_replicas=args.replicas,
        ray_actor_options={"num_cpus": 0.1, "num_gpus": args.fraction},
        gang_scheduling_config={"gang_size": args.gang_size, "gang_placement_strategy": "PACK"},
    )
    class Member:
        def __call__(self) -> dict:
            context = serve.get_replica_context()
            gang = context.gang_context
            return {
                "replica": context.replica_id.unique_id,
                "gang": gang.gang_id,
                "rank": gang.rank,
                "gpu_ids": ray.get_gpu_ids(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            }

    handle = serve.run(Member.bind(), name="gang", route_prefix=None)
    members: dict[str, dict] = {}
    for _ in range(50 * args.replicas):  # the router spreads calls: every member answers soon
        member = handle.remote().result()
        members[member["replica"]] = member
        if len(members) == args.replicas:
            break
    for member in sorted(members.values(), key=lambda m: (m["gang"], m["rank"])):
        print(json.dumps(member))
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
