# The runtime base with Python, as carry derives it (carry/image/locked/runtimebase.py, image.runtime_python: apt)
# when a platform's runtime image holds no python3, as NVIDIA's CUDA runtime images do, or when the runtime needs more
# of the distribution (image.runtime_packages, e.g. g++ and python3-dev: Triton and FlashInfer compile at run time):
# the distribution's own python3 and python3-venv and those packages, installed by the image's own apt from the
# package sources the image itself names (nothing here names a host). One BuildKit build per platform (its package
# scripts run under QEMU for another CPU), kept as a local image named by the source image's content digest, this
# recipe's hash and the packages, so it runs once per machine. The lock records that digest and hash, never the
# derived image's ID. carry fills SOURCE with a local tag of the runtime image and PACKAGES with the names it checked
# (Debian package names: nothing a shell reads); its instructions (comments aside) are the recipe that is hashed.
ARG SOURCE
# hadolint ignore=DL3006
FROM ${SOURCE}
ARG PACKAGES=""
# hadolint ignore=DL3008,SC2086
RUN set -eu; \
    export DEBIAN_FRONTEND=noninteractive; \
    apt-get -o Acquire::Languages=none update; \
    apt-get install -y --no-install-recommends python3 python3-venv ${PACKAGES}; \
    apt-get clean; \
    rm -rf /var/lib/apt/lists/*
