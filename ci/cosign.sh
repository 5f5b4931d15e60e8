#!/usr/bin/env bash
# The real cosign for the tests (tests/test_trust_cosign.py): Debian's own build of it, the `cosign` package of
# Debian 13 (trixie), fetched the ordinary way and unpacked into a tools directory, nothing installed system-wide.
# Its binary needs only libc6 (>= 2.34), so it runs on Debian 12 as it is.
#
# - The mirror is this machine's own: the Debian archive its apt sources name for its own release (read from
#   `apt-get indextargets` at run time; no host is written here). $CARRY_DEBIAN_MIRROR overrides it on a machine
#   whose sources name no Debian archive.
# - apt fetches through a private configuration (its own sources list for trixie, state and cache directories under
#   a temp dir, the system's Debian archive keyring): `apt-get update` checks trixie's signed InRelease, `apt-get
#   download` the .deb, and the .deb's sha256 is checked again against the SHA256 of that signed index.
# - `dpkg -x` unpacks it into $CARRY_TOOLS_DIR/cosign (default $CARRY_CI_DIR/tools/cosign); the binary's path is
#   recorded as CARRY_TEST_COSIGN in the env file the tests read (.ci/env-file.sh).
#
# Idempotent and fast when done: a stamp beside the binary names the package, version and sha256 unpacked, and
# nothing is fetched while it holds COSIGN_VERSION. docs/trust.md names the version the tests verify against.
set -euo pipefail

# shellcheck source=../.ci/env-file.sh
source "$(dirname "${BASH_SOURCE[0]}")/../.ci/env-file.sh"
COSIGN_VERSION=2.5.0 # the upstream version docs/trust.md names; Debian's revisions of it (2.5.0-2+b5) are taken
SUITE=trixie
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
TOOLS_DIR=${CARRY_TOOLS_DIR:-$CI_DIR/tools}
DEST=$TOOLS_DIR/cosign
BINARY=$DEST/usr/bin/cosign
STAMP=$DEST/.carry-deb

log() { printf 'cosign: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

already_there() {
    [ -x "$BINARY" ] && [ -f "$STAMP" ] && grep -q "^cosign $COSIGN_VERSION-" "$STAMP" \
        && "$BINARY" version >/dev/null 2>&1
}

# the Debian archive this machine's apt sources name for its own release (not its -security or -updates suites)
debian_mirror() {
    if [ -n "${CARRY_DEBIAN_MIRROR:-}" ]; then
        printf '%s\n' "${CARRY_DEBIAN_MIRROR%/}/"
        return
    fi
    local codename
    codename=$(. /etc/os-release && printf '%s' "${VERSION_CODENAME:-}")
    [ -n "$codename" ] || die "/etc/os-release names no VERSION_CODENAME; set CARRY_DEBIAN_MIRROR to a Debian archive"
    # shellcheck disable=SC2016 # $(REPO_URI) is apt's field, not the shell's
    apt-get indextargets --format '$(REPO_URI)' "Release: $codename" "Target-Of: deb" "Identifier: Packages" \
        | head -n 1
}

fetch() {
    local mirror=$1 work=$2
    local apt_options=(
        -o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=$work/empty"
        -o "Dir::Etc::Preferences=$work/empty/preferences" -o "Dir::Etc::PreferencesParts=$work/empty"
        -o "Dir::State=$work/state" -o "Dir::State::status=$work/status" -o "Dir::Cache=$work/cache"
        -o Acquire::Languages=none -o APT::Get::List-Cleanup=false
    )
    mkdir -p "$work/empty" "$work/state/lists/partial" "$work/cache/archives/partial" "$work/deb"
    : >"$work/status"
    # apt's download helper runs as _apt: it must reach these directories and write the .deb
    chmod 755 "$work"
    if id _apt >/dev/null 2>&1; then chown _apt "$work/deb"; fi
    printf 'deb [signed-by=%s] %s %s main\n' "$KEYRING" "$mirror" "$SUITE" >"$work/sources.list"
    apt-get "${apt_options[@]}" -qq update >"$work/update.log" 2>&1 \
        || { cat "$work/update.log" >&2; die "apt-get update of $SUITE from $mirror failed"; }
    local show version sha256
    show=$(apt-cache "${apt_options[@]}" show --no-all-versions cosign) \
        || die "$SUITE's index at $mirror has no cosign package"
    version=$(sed -n 's/^Version: //p' <<<"$show")
    sha256=$(sed -n 's/^SHA256: //p' <<<"$show")
    case "$version" in
        "$COSIGN_VERSION"-*) ;;
        *) die "$SUITE now has cosign $version, not $COSIGN_VERSION: run the tests with it, then update COSIGN_VERSION here and docs/trust.md" ;;
    esac
    [ ${#sha256} -eq 64 ] || die "$SUITE's index gives no SHA256 for cosign $version"
    (cd "$work/deb" && apt-get "${apt_options[@]}" -qq download "cosign=$version") >"$work/download.log" 2>&1 \
        || { cat "$work/download.log" >&2; die "apt-get download cosign=$version failed"; }
    local deb
    deb=$(find "$work/deb" -name 'cosign_*.deb' -print -quit)
    [ -n "$deb" ] || die "apt-get download left no cosign .deb"
    local got
    got=$(sha256sum "$deb" | cut -d' ' -f1)
    [ "$got" = "$sha256" ] || die "$(basename "$deb") has sha256 $got; $SUITE's signed index says $sha256"
    [ "$(dpkg-deb --field "$deb" Package)" = cosign ] || die "$(basename "$deb") is not the cosign package"
    dpkg -x "$deb" "$work/unpacked"
    "$work/unpacked/usr/bin/cosign" version >/dev/null 2>&1 \
        || die "the unpacked cosign $version does not run here (it needs libc6 >= 2.34)"
    printf 'cosign %s %s %s %s\n' "$version" "$(dpkg-deb --field "$deb" Architecture)" "$sha256" "$SUITE" \
        >"$work/unpacked/.carry-deb"
    printf '%s %s\n' "$version" "$sha256"
}

main() {
    if ! already_there; then
        [ -f "$KEYRING" ] || die "$KEYRING is missing: apt-get install debian-archive-keyring"
        local mirror fetched
        mirror=$(debian_mirror)
        [ -n "$mirror" ] || die "apt's sources name no Debian archive for this release; set CARRY_DEBIAN_MIRROR"
        WORK=$(mktemp -d "${TMPDIR:-/tmp}/carry-cosign.XXXXXX")
        trap 'rm -rf "$WORK"' EXIT
        fetched=$(fetch "$mirror" "$WORK")
        mkdir -p "$TOOLS_DIR"
        rm -rf "$DEST.old"
        if [ -e "$DEST" ]; then mv "$DEST" "$DEST.old"; fi
        mv "$WORK/unpacked" "$DEST"
        rm -rf "$DEST.old"
        log "cosign ${fetched% *} from $SUITE (sha256 ${fetched#* }, checked against the signed index) in $DEST"
    fi
    set_env CARRY_TEST_COSIGN "$BINARY"
}

main "$@"
