#!/usr/bin/env bash
# Commit what a save changed under perf_baselines/ and push it to BRANCH of origin (the
# re-save job's last step). Only perf_baselines/ goes into the commit, never the run's
# reports, so a merge of it alone starts no workflow run (the push trigger's paths-ignore).
# Usage: commit-baselines.sh BRANCH MESSAGE
set -euo pipefail
usage="usage: commit-baselines.sh BRANCH MESSAGE"
branch=${1:?$usage}
message=${2:?$usage}
dir=perf_baselines
if [ ! -d "$dir" ]; then
  echo "distperf: no $dir/ folder: the save wrote no baseline, so there is nothing to commit"
  exit 0
fi
git add --all -- "$dir"
if git diff --cached --quiet -- "$dir"; then
  echo "distperf: $dir/ is unchanged: nothing to commit"
  exit 0
fi
git -c user.name="github-actions[bot]" \
    -c user.email="41898282+github-actions[bot]@users.noreply.github.com" \
    commit --quiet --message "$message" -- "$dir"
if ! git push --quiet origin "HEAD:refs/heads/$branch"; then
  echo "::error::could not push the saved baselines to $branch (did the branch move during" \
       "the save?): re-save on its new head (label the pull request again)"
  exit 1
fi
git log -1 --format="distperf: pushed %h to $branch: %s"
