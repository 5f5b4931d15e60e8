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
