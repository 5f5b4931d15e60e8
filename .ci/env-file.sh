# shellcheck shell=bash
# Sourced by services.sh and base-images.sh: where CI state lives, and how facts are recorded in the
# env file ($CARRY_CI_ENV, KEY=VALUE lines that tests/dockerenv.py reads).
CI_DIR=${CARRY_CI_DIR:-/tmp/carry-ci}
ENV_FILE=${CARRY_CI_ENV:-$CI_DIR/env}

# set_env KEY VALUE: replace KEY's line in the env file (atomically), keeping the rest.
set_env() {
    local tmp
    tmp=$(mktemp "$ENV_FILE.XXXXXX")
    { grep -v "^$1=" "$ENV_FILE" 2>/dev/null || true; printf '%s=%s\n' "$1" "$2"; } >"$tmp"
    chmod 644 "$tmp"
    mv "$tmp" "$ENV_FILE"
}
