#!/usr/bin/env bash
# Start the services the tests talk to: a Docker engine, a local registry with
# htpasswd auth, and a redis with a password (the shared compile cache). Safe to
# run again: whatever already answers is kept.
#
# Writes the connection facts to $CARRY_CI_ENV (KEY=VALUE lines, sourceable).
# The registry and redis passwords live only in mode-600 files; they are never
# printed and never passed on a command line (redis reads its own from a
# mode-600 config file).
#
# Overridable: CARRY_CI_DIR (state, default /tmp/carry-ci), CARRY_CI_ENV (default
# $CARRY_CI_DIR/env), CARRY_TEST_REGISTRY_PORT (default 5055, away from the 5000 of the
# packaged registry service), CARRY_TEST_REGISTRY_USER (default carry-ci),
# CARRY_TEST_REDIS_PORT (default 6390, away from redis' own 6379).
set -euo pipefail

# shellcheck source=env-file.sh
source "$(dirname "${BASH_SOURCE[0]}")/env-file.sh"
REGISTRY_PORT=${CARRY_TEST_REGISTRY_PORT:-5055}
REGISTRY_USER=${CARRY_TEST_REGISTRY_USER:-carry-ci}
REGISTRY_ADDR=127.0.0.1:$REGISTRY_PORT
REGISTRY_DIR=$CI_DIR/registry
PASSWORD_FILE=$REGISTRY_DIR/password
REDIS_PORT=${CARRY_TEST_REDIS_PORT:-6390}
REDIS_ADDR=127.0.0.1:$REDIS_PORT
REDIS_DIR=$CI_DIR/redis
REDIS_PASSWORD_FILE=$REDIS_DIR/password
DOCKER=/usr/bin/docker
DOCKER_SOCKET=/var/run/docker.sock
WAIT_SECONDS=${CARRY_CI_WAIT_SECONDS:-60}
# pigz: dockerd decompresses pulled layers with unpigz when it is on PATH (a 9 GB vLLM image pulls much faster).
# skopeo: someone else's registry client reading carry's signatures back in the tests (docs/trust.md).
# bubblewrap: the sandbox of the sccache-dist build servers tests/test_distbuild.py starts (ci/dist-cluster.sh).
# cmake: reads vLLM's own CMakeLists.txt for its file list (bench/distbuild.py, tests/test_bench_distbuild.py).
PACKAGES=(docker.io docker-registry apache2-utils ccache mmdebstrap zstd curl redis-server redis-tools shellcheck pigz skopeo
    bubblewrap cmake)

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

# write_password_once FILE WHAT: a random password in a mode-600 FILE, unless one is there.
write_password_once() {
    [ -s "$1" ] && return
    log "generating $2 password"
    (umask 077 && head -c 24 /dev/urandom | base64 | tr -d '/+=\n' >"$1.tmp")
    mv "$1.tmp" "$1"
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
    write_password_once "$PASSWORD_FILE" registry
    write_htpasswd
    write_registry_config
    log "starting registry on $REGISTRY_ADDR (log: $CI_DIR/registry.log)"
    setsid docker-registry serve "$REGISTRY_DIR/config.yml" </dev/null >"$CI_DIR/registry.log" 2>&1 &
    echo $! >"$CI_DIR/registry.pid"
    wait_until "$WAIT_SECONDS" registry registry_demands_auth \
        || die "registry on $REGISTRY_ADDR did not answer 401 on /v2/ within ${WAIT_SECONDS}s; see $CI_DIR/registry.log"
}

# What redis answers to an unauthenticated PING: NOAUTH when it demands the password.
redis_answer() {
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>&1 || true
}

redis_demands_auth() { redis_answer | grep -q NOAUTH; }

redis_port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$REDIS_PORT") 2>/dev/null; }

write_redis_config() {
    (umask 077 && {
        printf 'bind 127.0.0.1\nport %s\nprotected-mode yes\ndaemonize no\n' "$REDIS_PORT"
        printf 'dir %s\nsave ""\nappendonly no\n' "$REDIS_DIR/data"
        printf 'maxmemory 2gb\nmaxmemory-policy allkeys-lru\n'
        printf 'requirepass %s\n' "$(cat "$REDIS_PASSWORD_FILE")"
    } >"$REDIS_DIR/redis.conf.tmp")
    mv "$REDIS_DIR/redis.conf.tmp" "$REDIS_DIR/redis.conf"
}

start_redis() {
    if redis_demands_auth && [ -s "$REDIS_PASSWORD_FILE" ]; then
        log "redis already running on $REDIS_ADDR"
        return
    fi
    redis_port_free || die "something else answers on $REDIS_ADDR; set CARRY_TEST_REDIS_PORT to a free port"
    mkdir -p "$REDIS_DIR/data"
    chmod 700 "$REDIS_DIR"
    write_password_once "$REDIS_PASSWORD_FILE" redis
    write_redis_config
    log "starting redis on $REDIS_ADDR (log: $CI_DIR/redis.log)"
    setsid redis-server "$REDIS_DIR/redis.conf" </dev/null >"$CI_DIR/redis.log" 2>&1 &
    echo $! >"$CI_DIR/redis.pid"
    wait_until "$WAIT_SECONDS" redis redis_demands_auth \
        || die "redis on $REDIS_ADDR did not answer NOAUTH within ${WAIT_SECONDS}s; see $CI_DIR/redis.log"
}

write_env_file() {
    set_env DOCKER_HOST "unix://$DOCKER_SOCKET"
    set_env CARRY_TEST_REGISTRY "$REGISTRY_ADDR"
    set_env CARRY_TEST_REGISTRY_USER "$REGISTRY_USER"
    set_env CARRY_TEST_REGISTRY_PASSWORD_FILE "$PASSWORD_FILE"
    set_env CARRY_TEST_REDIS "$REDIS_ADDR"
    set_env CARRY_TEST_REDIS_PASSWORD_FILE "$REDIS_PASSWORD_FILE"
    log "wrote $ENV_FILE"
}

main() {
    [ "$(id -u)" = 0 ] || die "run as root (installs packages and starts dockerd)"
    mkdir -p "$CI_DIR" "$(dirname "$ENV_FILE")"
    install_missing_packages
    start_docker
    start_registry
    start_redis
    write_env_file
}

main "$@"
