#!/usr/bin/env bash
# Start the services the image tests talk to: a Docker engine and a local
# registry with htpasswd auth. Safe to run again: whatever already answers is kept.
#
# Writes the connection facts to $CARRY_CI_ENV (KEY=VALUE lines, sourceable).
# The registry password lives only in a mode-600 file; it is never printed
# and never passed on a command line.
#
# Overridable: CARRY_CI_DIR (state, default /tmp/carry-ci), CARRY_CI_ENV (default
# $CARRY_CI_DIR/env), CARRY_TEST_REGISTRY_PORT (default 5055, away from the 5000 of the
# packaged registry service), CARRY_TEST_REGISTRY_USER (default carry-ci).
set -euo pipefail

# shellcheck source=env-file.sh
source "$(dirname "${BASH_SOURCE[0]}")/env-file.sh"
REGISTRY_PORT=${CARRY_TEST_REGISTRY_PORT:-5055}
REGISTRY_USER=${CARRY_TEST_REGISTRY_USER:-carry-ci}
REGISTRY_ADDR=127.0.0.1:$REGISTRY_PORT
REGISTRY_DIR=$CI_DIR/registry
PASSWORD_FILE=$REGISTRY_DIR/password
DOCKER=/usr/bin/docker
DOCKER_SOCKET=/var/run/docker.sock
WAIT_SECONDS=${CARRY_CI_WAIT_SECONDS:-60}
PACKAGES=(docker.io docker-registry apache2-utils ccache mmdebstrap zstd curl)

log() { printf 'services: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

install_missing_packages() {
    local missing=() pkg
    for pkg in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' \
            || missing+=("$pkg")
    done
    [ ${#missing[@]} -eq 0 ] && return
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# wait_until SECONDS WHAT COMMAND...: poll COMMAND until it succeeds or time runs out.
wait_until() {
    local seconds=$1 what=$2 deadline
    shift 2
    deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 0.5
    done
    log "$what is up"
}

docker_answers() { "$DOCKER" --host "unix://$DOCKER_SOCKET" version; }

start_docker() {
    if docker_answers >/dev/null 2>&1; then
        log "dockerd already running"
        return
    fi
    log "starting dockerd (log: $CI_DIR/dockerd.log)"
    setsid dockerd --host "unix://$DOCKER_SOCKET" </dev/null >"$CI_DIR/dockerd.log" 2>&1 &
    echo $! >"$CI_DIR/dockerd.pid"
    wait_until "$WAIT_SECONDS" dockerd docker_answers \
        || die "dockerd did not answer on $DOCKER_SOCKET within ${WAIT_SECONDS}s; see $CI_DIR/dockerd.log"
}

registry_status() {
    curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$REGISTRY_ADDR/v2/" || true
}

registry_demands_auth() { [ "$(registry_status)" = 401 ]; }

write_password_once() {
    [ -s "$PASSWORD_FILE" ] && return
    log "generating registry password"
    (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=\n' >"$PASSWORD_FILE.tmp")
    mv "$PASSWORD_FILE.tmp" "$PASSWORD_FILE"
}

write_htpasswd() {
    (umask 077 && htpasswd -niB "$REGISTRY_USER" <"$PASSWORD_FILE" >"$REGISTRY_DIR/htpasswd.tmp")
    mv "$REGISTRY_DIR/htpasswd.tmp" "$REGISTRY_DIR/htpasswd"
}

write_registry_config() {
    local http_secret
    http_secret=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
    (umask 077 && cat >"$REGISTRY_DIR/config.yml" <<EOF
version: 0.1
log:
  level: info
storage:
  filesystem:
    rootdirectory: $REGISTRY_DIR/data
  delete:
    enabled: true
http:
  addr: $REGISTRY_ADDR
  secret: $http_secret
auth:
  htpasswd:
    realm: carry-test-registry
    path: $REGISTRY_DIR/htpasswd
EOF
    )
}

start_registry() {
    if registry_demands_auth && [ -s "$PASSWORD_FILE" ] && [ -s "$REGISTRY_DIR/config.yml" ]; then
        log "registry already running on $REGISTRY_ADDR"
        return
    fi
    [ "$(registry_status)" = 000 ] \
        || die "something else answers on $REGISTRY_ADDR; set CARRY_TEST_REGISTRY_PORT to a free port"
    mkdir -p "$REGISTRY_DIR/data"
    write_password_once
    write_htpasswd
    write_registry_config
    log "starting registry on $REGISTRY_ADDR (log: $CI_DIR/registry.log)"
    setsid docker-registry serve "$REGISTRY_DIR/config.yml" </dev/null >"$CI_DIR/registry.log" 2>&1 &
    echo $! >"$CI_DIR/registry.pid"
    wait_until "$WAIT_SECONDS" registry registry_demands_auth \
        || die "registry on $REGISTRY_ADDR did not answer 401 on /v2/ within ${WAIT_SECONDS}s; see $CI_DIR/registry.log"
}

write_env_file() {
    set_env DOCKER_HOST "unix://$DOCKER_SOCKET"
    set_env CARRY_TEST_REGISTRY "$REGISTRY_ADDR"
    set_env CARRY_TEST_REGISTRY_USER "$REGISTRY_USER"
    set_env CARRY_TEST_REGISTRY_PASSWORD_FILE "$PASSWORD_FILE"
    log "wrote $ENV_FILE"
}

main() {
    [ "$(id -u)" = 0 ] || die "run as root (installs packages and starts dockerd)"
    mkdir -p "$CI_DIR" "$(dirname "$ENV_FILE")"
    install_missing_packages
    start_docker
    start_registry
    write_env_file
}

main "$@"
