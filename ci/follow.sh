#!/usr/bin/env bash
# Follow upstream: `carry follow [REF]` (REF: $CARRY_FOLLOW_REF, else build.yaml's upstream.follow) makes the branch
# carry/follow/<REF> with one commit per step and pushes it to origin (git's own credentials: actions/checkout's),
# then ci/follow_pr.py opens or updates the one pull request of that branch with the report as its body: a draft
# when a human is needed (follow's exit 1: a conflict nobody recorded a resolution for, a regression). Exit 2
# (bad input) fails the job; exit 1 leaves the draft and a warning. Needs GITHUB_TOKEN (pull-requests: write),
# GITHUB_REPOSITORY and GITHUB_API_URL, as GitHub Actions sets them; CARRY_FOLLOW_REMOTE names another remote.
set -euo pipefail
cd "$(dirname "$0")/.."

config="${CARRY_CONFIG:-build.yaml}" # relative to the repo root
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
ref="${CARRY_FOLLOW_REF:-}"
remote="${CARRY_FOLLOW_REMOTE:-origin}"
status=0
if [ -n "$ref" ]; then
    python build.py --config "$config" follow "$ref" --push "$remote" --json --body "$scratch/body.md" \
        >"$scratch/report.json" || status=$?
else
    python build.py --config "$config" follow --push "$remote" --json --body "$scratch/body.md" \
        >"$scratch/report.json" || status=$?
fi
if [ "$status" -ge 2 ]; then
    exit "$status"
fi
if [ -f "$scratch/body.md" ]; then
    cat "$scratch/body.md"
    if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
        cat "$scratch/body.md" >>"$GITHUB_STEP_SUMMARY"
    fi
fi
python ci/follow_pr.py "$scratch/report.json" "$scratch/body.md" --base "${CARRY_FOLLOW_BASE:-main}"
if [ "$status" -eq 1 ]; then
    echo "::warning::carry follow needs a human: the pull request is a draft; see its body"
fi
