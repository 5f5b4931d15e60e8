# carry's image. `python build.py image` assembles the build context (carry itself, build.py, the config
# with VERSION and patches/, a git bundle of the pinned upstream commit, and in hermetic mode a wheelhouse)
# and fills every build arg from build.yaml. The build stage runs the same `build.py wheel` as a
# workstation does: fetch (falling back to the bundle), strict series check, wheel, arch gate, buildinfo.
# A precompiled build (build.precompiled) finds its upstream wheel in the context's cache/downloads.
# The runtime stage installs only that wheel; the `wheel` stage holds only the wheel, for `build.py wheel
# --platform P`, which exports it with `--output type=local`. Needs BuildKit (cache and secret mounts).
# Every stage builds for one platform (`--platform`); another CPU's runs under QEMU where the host has it.

ARG BASE_IMAGE=nvcr.io/nvidia/cuda:13.0.1-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvcr.io/nvidia/cuda:13.0.1-runtime-ubuntu24.04

FROM ${BASE_IMAGE} AS build
ARG CARRY_CONFIG=project/build.yaml
ARG CARRY_ARCHES
ARG PIP_INSTALL_ARGS=
WORKDIR /carry
COPY . /carry
# /opt/carry holds carry and the upstream's [build-system] requires (requirements.txt): carry builds in it
# (CARRY_BUILD_PYTHON) once it has checked every requirement is there, instead of making a venv with uv.
# build.yaml's image.secret_env and the shared compile cache's URL and credentials (CARRY_REMOTE_CACHE_*) arrive
# as a BuildKit secret: readable during this step only, never in a layer or the cache key.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.cache/carry-ccache \
    --mount=type=secret,id=carry_env \
    set -eu; \
    if [ -s /run/secrets/carry_env ]; then set -a; . /run/secrets/carry_env; set +a; fi; \
    python3 -m venv /opt/carry; \
    /opt/carry/bin/pip install --disable-pip-version-check ${PIP_INSTALL_ARGS} -r /carry/requirements.txt; \
    mkdir -p /tmp/carry-cache; cp -r /carry/cache/bundles /tmp/carry-cache/; \
    CARRY_CACHE=/tmp/carry-cache CCACHE_DIR=/root/.cache/carry-ccache CARRY_BUILD_PYTHON=/opt/carry/bin/python \
    CARRY_DOWNLOADS=/carry/cache/downloads \
        /opt/carry/bin/python /carry/build.py --config "/carry/${CARRY_CONFIG}" \
        wheel --arch "${CARRY_ARCHES}" --out /dist; \
    rm -rf /tmp/carry-cache

FROM scratch AS wheel
COPY --from=build /dist/ /

FROM ${RUNTIME_IMAGE} AS runtime
ARG PIP_INSTALL_ARGS=
COPY --from=build /dist/ /tmp/carry-dist/
COPY --from=build /carry/wheelhouse/ /carry/wheelhouse/
COPY runtime.env /etc/carry/runtime.env
COPY entrypoint.sh /usr/local/bin/carry-entrypoint
RUN set -eu; \
    python3 -m venv /opt/venv; \
    /opt/venv/bin/pip install --disable-pip-version-check --no-cache-dir ${PIP_INSTALL_ARGS} /tmp/carry-dist/*.whl; \
    rm -rf /tmp/carry-dist /carry
ENV PATH=/opt/venv/bin:$PATH
ENTRYPOINT ["/usr/local/bin/carry-entrypoint"]
CMD ["python3"]
