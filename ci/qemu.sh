#!/usr/bin/env bash
# Let this machine run the other CPU's Linux programs, so that arm64 images (GB10 / DGX Spark) build and run on
# an x86-64 machine (and amd64 ones on an arm64 machine): QEMU's user-mode emulators registered with the kernel's
# binfmt_misc. The handlers carry registers have the F flag (the kernel opens the emulator once, at registration),
# so they also work inside containers and `docker build --platform`. Only the other CPU's handler is enabled:
# carry refuses a platform whose handler is missing (the tests count on riscv64 having none).
# Idempotent; runs as root without stdin.
set -euo pipefail

BINFMT_DIR=/proc/sys/fs/binfmt_misc
PACKAGES=(qemu-user-static binfmt-support arch-test)

log() { printf 'qemu: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

case "$(uname -m)" in
    x86_64) handler=qemu-aarch64 ;;
    aarch64) handler=qemu-x86_64 ;;
    *) die "no emulation plan for a $(uname -m) machine; build on amd64 or arm64" ;;
esac

[ "$(id -u)" = 0 ] || die "run as root (installs packages and registers binfmt handlers)"
missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if ! mountpoint -q "$BINFMT_DIR"; then
    mount -t binfmt_misc binfmt_misc "$BINFMT_DIR" || die "cannot mount $BINFMT_DIR (needs a privileged machine)"
fi
update-binfmts --enable "$handler" || die "update-binfmts could not enable $handler"
grep -qx enabled "$BINFMT_DIR/$handler" || die "$handler is registered but not enabled"
grep -q '^flags: .*F' "$BINFMT_DIR/$handler" || die "$handler lacks the F flag; containers could not use it"
foreign=${handler#qemu-}
arch-test "$( [ "$foreign" = aarch64 ] && echo arm64 || echo amd64 )" >/dev/null \
    || die "the kernel does not run $foreign programs through $handler"
log "$handler enabled ($(sed -n 's/^interpreter //p' "$BINFMT_DIR/$handler"))"
