#!/usr/bin/env bash
# Shared helpers for the ci/ scripts; sourced, not run.

# Run a command as root: directly when we are root, else through sudo without a prompt (CI runners).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    else
        sudo -n "$@"
    fi
}

# The tag suffix for a platform: linux/arm64 -> arm64, linux/arm/v7 -> arm-v7.
arch_tag() {
    local arch="${1#*/}"
    printf '%s\n' "${arch//\//-}"
}

# The docker platform of this machine's CPU, for the platforms carry builds natively.
native_platform() {
    case "$(uname -m)" in
        x86_64) echo linux/amd64 ;;
        aarch64 | arm64) echo linux/arm64 ;;
        *) echo "ci: no native docker platform known for $(uname -m)" >&2; return 1 ;;
    esac
}

# The key route of signing: $CARRY_SIGNING_KEY_PEM (the private key's PEM, from a secret) written to a mode-600
# file in a private temp dir, named by $CARRY_SIGNING_KEY for carry, and the PEM dropped from the environment.
# The caller removes "$signing_dir" (a trap). Nothing when the secret is empty (keyless or unsigned).
signing_key_from_secret() {
    signing_dir=""
    if [ -z "${CARRY_SIGNING_KEY_PEM:-}" ]; then
        unset CARRY_SIGNING_KEY_PEM
        return 0
    fi
    signing_dir="$(mktemp -d)"
    chmod 700 "$signing_dir"
    (umask 077 && printf '%s\n' "$CARRY_SIGNING_KEY_PEM" >"$signing_dir/carry.key")
    unset CARRY_SIGNING_KEY_PEM
    export CARRY_SIGNING_KEY="$signing_dir/carry.key"
}

# The public key the images are signed with, for `verify --key`, when the repository holds it ($CARRY_VERIFY_KEY,
# default signing/carry.pub): printed, exit 0; else exit 1 (verify then says the signature was not checked).
verify_key() {
    local pub="${CARRY_VERIFY_KEY:-signing/carry.pub}"
    [ -f "$pub" ] && printf '%s\n' "$pub"
}
