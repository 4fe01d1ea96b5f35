"""Rehearse the production rollout on one machine: a multi-node Ray cluster started with `ray
start`, GPUs advertised as Ray resources, and the production serve config (docs/deploy.md)."""
