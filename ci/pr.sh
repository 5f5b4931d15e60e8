#!/usr/bin/env bash
# Pull request checks: the series must apply in order onto the pinned base (`check` exits 1 if not), then the
# drop verdicts against upstream main and the PR head (`status`) are printed and added to the job summary.
set -euo pipefail
cd "$(dirname "$0")/.."

config="${CARRY_CONFIG:-build.yaml}"  # relative to the repo root

python build.py --config "$config" check

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
upstream_url="$(python ci/carry_query.py upstream.url --config "$config")"
python build.py --config "$config" status --json >"$scratch/status.json"
python ci/drop_report.py render "$scratch/status.json" --upstream-url "$upstream_url" >"$scratch/report.md"
cat "$scratch/report.md"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$scratch/report.md" >>"$GITHUB_STEP_SUMMARY"
fi
