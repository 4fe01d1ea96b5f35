#!/usr/bin/env bash
# In the project's root: the project as the offline GPU machine runs it, in .gpu/proj: the tracked
# files as they are in the working tree, with vllm026.patch applied (vLLM 0.26's import paths;
# the project pins 0.32, which needs a newer torch than that machine has).
set -euo pipefail
G=${G:-.gpu}
S=$(cd "$(dirname "$0")" && pwd)
rm -rf "$G/proj"
mkdir -p "$G/proj"
# a commit of the working tree's tracked files, uncommitted changes included (none: HEAD)
REV=$(git stash create)
git archive "${REV:-HEAD}" | tar -x -C "$G/proj"
patch -d "$G/proj" -p1 --no-backup-if-mismatch < "$S/vllm026.patch"
du -sh "$G/proj"
