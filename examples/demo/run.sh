#!/usr/bin/env bash
# The main job on the bundled demo, end to end, after `bash ci/setup.sh`: check the series, build and verify the
# wheel on this machine, build and verify the GB10 (linux/arm64) wheel in its build stage (emulated on an x86-64
# machine), build the hermetic image for linux/amd64 and linux/arm64, push it to the registry ci/setup.sh started
# on loopback (VERSION, VERSION-cu130 and latest become manifest lists of both), and verify every platform of the
# VERSION tag as pulled back from the registry. Prints where each artifact is.
#
# The registry login comes from what .ci/services.sh recorded: the password is read from its mode-600 file into
# CARRY_REGISTRY_PASSWORD, which carry hands to `docker login --password-stdin`; it is never an argument.
set -euo pipefail
cd "$(dirname "$0")/../.."

config=examples/demo/build.yaml
env_file=${CARRY_CI_ENV:-/tmp/carry-ci/env}
[ -f "$env_file" ] || { echo "demo: no $env_file; run bash ci/setup.sh first" >&2; exit 2; }
setting() { sed -n "s/^$1=//p" "$env_file"; }
name=$(python3 ci/carry_query.py image.name --config "$config")
registry=$(setting CARRY_TEST_REGISTRY)
[ "${name%%/*}" = "$registry" ] || { echo "demo: $config pushes to ${name%%/*}, the registry runs on $registry" >&2; exit 2; }
export CARRY_REGISTRY_USER
CARRY_REGISTRY_USER=$(setting CARRY_TEST_REGISTRY_USER)
export CARRY_REGISTRY_PASSWORD
CARRY_REGISTRY_PASSWORD=$(cat "$(setting CARRY_TEST_REGISTRY_PASSWORD_FILE)")

carry() { python3 build.py --config "$config" "$@"; }
version=$(carry version)
carry check
wheel=$(carry wheel | tail -n 1)
carry verify "$wheel"
arm64_wheel=$(carry wheel --platform linux/arm64 --hermetic | tail -n 1)
carry verify "$arm64_wheel"
carry image --platform linux/amd64 --platform linux/arm64 --hermetic --push
carry verify "$name:$version"

cat <<DONE

demo: done; VERSION $version
  wheel (this machine)    $wheel
  wheel (GB10, arm64)     $arm64_wheel
  image (amd64 + arm64)   $name:$version  (also :$version-cu130, :latest; per platform :$version-amd64, :$version-arm64)
  pull it                 docker pull --platform linux/arm64 $name:$version
DONE
