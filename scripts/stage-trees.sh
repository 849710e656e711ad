#!/usr/bin/env bash
# Unpacks experiment branches as plain trees under .exp/ (ignored by git) so that
# one device call can build and measure them beside this tree
# (scripts/gpu-trees.sh; the device tool carries [".deps", ".anchors", ".exp", ".tree"]).
# Each tree shares this checkout's .deps; .tree records this tree's commit for env.txt.
# Usage: scripts/stage-trees.sh BRANCH=NAME...   e.g. scripts/stage-trees.sh exp/rope-registers=R
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd); cd "$root"
[ $# -ge 1 ] || { echo "usage: scripts/stage-trees.sh BRANCH=NAME..." >&2; exit 2; }
for spec in "$@"; do
  branch=${spec%%=*} name=${spec#*=}
  [ "$branch" != "$spec" ] && [ -n "$name" ] && [ "${name#*/}" = "$name" ] ||
    { echo "stage-trees: '$spec' is not BRANCH=NAME (NAME without '/')" >&2; exit 2; }
  git rev-parse --verify -q "$branch^{commit}" >/dev/null || { echo "stage-trees: no branch '$branch'" >&2; exit 2; }
  rm -rf ".exp/$name"; mkdir -p ".exp/$name"
  # Results and fuzz regressions are not needed to build or run and would eat the carry's 64 MiB.
  git archive "$branch" | tar -x -C ".exp/$name" --exclude=bench/results --exclude=fuzz/regressions
  ln -sfn ../../.deps ".exp/$name/.deps"
  echo "$(git rev-parse --short "$branch") $branch" >".exp/$name/.tree"
  echo ".exp/$name <- $branch ($(du -sh ".exp/$name" | cut -f1))"
done
git rev-parse HEAD >.tree
