"""`python -m rehearsal up|deploy|status|key|kill-node|add-node|down` (docs/deploy.md, "Rehearse")."""

from __future__ import annotations

import argparse
from pathlib import Path

from rehearsal.cluster import LocalCluster
from rehearsal.service import (
    DEFAULT_ROOT,
    add_node,
    cluster_up,
    create_key_now,
    print_json,
    serve_deploy,
    serve_status,
    summary,
)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m rehearsal", description=__doc__)
    parser.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_ROOT,
        help="The cluster's folder (keep it short: HAProxy's socket lives in it).",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="Start the head and one worker per node type.")
    up.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="NODE_TYPE",
        help="Leave a node type out (it can join later with add-node).",
    )
    up.add_argument(
        "--gcs-redis",
        default="",
        metavar="URL",
        help="Keep the GCS in this Redis (fault tolerance: the head can be lost and restarted).",
    )
    commands.add_parser(
        "deploy", help="`serve deploy` the production config, tiny model swapped in."
    )
    commands.add_parser("status", help="`serve status` of the cluster.")
    commands.add_parser("key", help="Create a user on the pro plan and print an API key.")
    for name, text in (
        ("kill-node", "Lose a node (SIGKILL), `head` too."),
        ("add-node", "Start a worker node, or the head again (`head`)."),
    ):
        commands.add_parser(name, help=text).add_argument("node_type")
    commands.add_parser("down", help="Stop every node of the cluster (HAProxy included).")
    args = parser.parse_args()

    if args.command == "up":
        print_json(summary(cluster_up(args.dir, tuple(args.without), args.gcs_redis)))
        return
    cluster = LocalCluster.load(args.dir)
    if args.command == "deploy":
        print(serve_deploy(cluster))
    elif args.command == "status":
        print_json(serve_status(cluster))
    elif args.command == "key":
        print(create_key_now(cluster))
    elif args.command == "kill-node":
        cluster.kill_node(args.node_type)
    elif args.command == "add-node":
        add_node(cluster, args.node_type)
    elif args.command == "down":
        cluster.stop()


if __name__ == "__main__":
    main()
