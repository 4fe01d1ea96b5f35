#!/usr/bin/env bash
# A Kubernetes Secret from the env file the VMs use (docs/deploy.md, step 3), each value as the
# shell reads it: `kubectl create secret --from-env-file` keeps a value's quotes, which breaks the
# database URL and the trusted proxies' JSON.
#
#   deploy/kubernetes/env-secret.sh ~/.serviceai/production.env serviceai-env -n serviceai
#
# Every NAME=... line of the file becomes a key; arguments after the Secret's name go to
# `kubectl create secret generic` (add `--dry-run=client -o yaml` to see it first).
set -euo pipefail
file=$1 name=$2
shift 2
names=$(sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' "$file")
set -a
# shellcheck source=/dev/null
. "$file"
set +a
literals=()
for variable in $names; do
    literals+=("--from-literal=$variable=${!variable}")
done
exec kubectl create secret generic "$name" "${literals[@]}" "$@"
