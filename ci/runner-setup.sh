#!/usr/bin/env bash
# Install carry on a CI runner (or a developer machine) and, under GitHub Actions, export CARRY_CACHE so the
# workflow's cache step saves and restores the same directory carry uses (mirrors, bundles, ccache, artifacts).
set -euo pipefail
cd "$(dirname "$0")/.."

python -m pip install --quiet --disable-pip-version-check -e .

if [ -n "${GITHUB_ENV:-}" ] && [ -z "${CARRY_CACHE:-}" ]; then
    echo "CARRY_CACHE=${HOME}/.cache/carry" >>"$GITHUB_ENV"
fi
