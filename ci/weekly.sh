#!/usr/bin/env bash
# Weekly drop report: the carried PR's own state and every carried patch's verdict against upstream main and
# against the PR head, turned by drop_report.py into one GitHub issue that is opened, updated, or closed when there
# is no news any more (nothing to drop, the PR not closed unmerged). The PR state comes from the GitHub API with
# GITHUB_TOKEN / GH_TOKEN where it answers, else from git. Needs GH_TOKEN (issues: write) and GH_REPO (or a GitHub
# remote) for `gh`. CARRY_REPORT_ONLY=1 only prints it.
set -euo pipefail
cd "$(dirname "$0")/.."

config="${CARRY_CONFIG:-build.yaml}"  # relative to the repo root

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
main_ref="$(python ci/carry_query.py upstream.main --config "$config")"
pr_ref="$(python ci/carry_query.py upstream.pr_ref --config "$config")"
upstream_url="$(python ci/carry_query.py upstream.url --config "$config")"

if [ -n "$pr_ref" ]; then
    python build.py --config "$config" status --against "$main_ref" --against "$pr_ref" --json \
        >"$scratch/status.json"
else
    python build.py --config "$config" status --against "$main_ref" --json >"$scratch/status.json"
fi

run_url=""
if [ -n "${GITHUB_RUN_ID:-}" ]; then
    run_url="${GITHUB_SERVER_URL:-https://github.com}/${GITHUB_REPOSITORY:?}/actions/runs/${GITHUB_RUN_ID}"
fi
python ci/drop_report.py render "$scratch/status.json" --upstream-url "$upstream_url" --run-url "$run_url" \
    >"$scratch/report.md"
cat "$scratch/report.md"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    cat "$scratch/report.md" >>"$GITHUB_STEP_SUMMARY"
fi
if [ "${CARRY_REPORT_ONLY:-0}" != 1 ]; then
    python ci/drop_report.py publish "$scratch/status.json" --upstream-url "$upstream_url" --run-url "$run_url"
fi
