# kubeddp training image: one Dockerfile, CUDA or CPU by build arg.
#
#   docker build -t kubeddp:cuda .                                  # GPU: torch's CUDA wheels
#   docker build -t kubeddp:cpu --build-arg VARIANT=cpu .           # CPU: PyTorch CPU index
#   docker build -t kubeddp:efa --build-arg VARIANT=efa .           # GPU + AWS EFA (libfabric, OFI plugin)
#
# Offline builds: put wheels in wheels/ and pass --build-arg PIP_OFFLINE=1.
# Behind a TLS-intercepting proxy: --build-arg CA_BUNDLE=path/in/context/ca.pem.
# Works with BuildKit and with the legacy builder (DOCKER_BUILDKIT=0): no BuildKit-only syntax.

ARG BASE_IMAGE=python:3.11-slim-bookworm
ARG VARIANT=cuda

# ---------------------------------------------------------------- build: a venv in /opt/venv
FROM ${BASE_IMAGE} AS build
ARG VARIANT
ARG TORCH_VERSION=2.13.0
ARG TORCH_CPU_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG PIP_OFFLINE=0
ARG CA_BUNDLE=
SHELL ["/bin/bash", "-e", "-o", "pipefail", "-c"]

# wheels/ always exists (it holds .gitkeep). An empty COPY source would mean the whole
# context, so an unset CA_BUNDLE names .gitkeep again instead.
COPY wheels/ ${CA_BUNDLE:-wheels/.gitkeep} /tmp/build-inputs/

# pip settings for this stage only, written once so every RUN below uses them.
ENV PIP_CONFIG_FILE=/tmp/build-inputs/pip.conf
RUN case "${VARIANT}" in \
      cpu) torch_index="${TORCH_CPU_INDEX_URL}" ;; \
      cuda|efa) torch_index="${PIP_INDEX_URL}" ;; \
      *) echo "VARIANT=${VARIANT} is not supported: use --build-arg VARIANT=cuda, VARIANT=efa or VARIANT=cpu" >&2; exit 2 ;; \
    esac; \
    { echo "[global]"; \
      echo "no-cache-dir = true"; \
      echo "disable-pip-version-check = true"; \
      echo "find-links = /tmp/build-inputs"; \
      echo "index-url = ${PIP_INDEX_URL}"; \
      if [ -n "${CA_BUNDLE}" ]; then echo "cert = /tmp/build-inputs/${CA_BUNDLE##*/}"; fi; \
      if [ "${PIP_OFFLINE}" = 1 ]; then echo "no-index = true"; fi; \
    } > "${PIP_CONFIG_FILE}"; \
    python3 -m venv /opt/venv; \
    /opt/venv/bin/pip install --no-cache-dir --no-deps --index-url "${torch_index}" \
      --extra-index-url "${PIP_INDEX_URL}" "torch==${TORCH_VERSION}"

# Every other package, pinned with its sha256 (requirements/image.lock, made by
# .ci/lock_image_deps.py): a rebuild gets the same bytes. The CUDA build of torch then adds the
# CUDA libraries, which its own metadata pins to exact versions; `pip check` below proves the
# set is complete. Then kubeddp itself without dependencies.
COPY requirements/image.lock /tmp/deps/
RUN /opt/venv/bin/pip install --no-cache-dir --require-hashes --no-deps -r /tmp/deps/image.lock; \
    if [ "${VARIANT}" != cpu ]; then \
      /opt/venv/bin/pip install --no-cache-dir "torch==${TORCH_VERSION}"; \
    fi; \
    rm -rf /tmp/deps
COPY pyproject.toml /src/
COPY kubeddp/ /src/kubeddp/
COPY trainer/ /src/trainer/
COPY tools/ /src/tools/
# The Helm chart is part of the package (kubeddp.chart): `kubeddp render` renders it.
COPY charts/kubeddp/ /src/charts/kubeddp/
# A wheel of kubeddp, installed in the runtime stage: a code change then adds a small layer
# there instead of a new copy of the whole venv. setuptools reads the readme that
# pyproject.toml names; the image does not need its text.
RUN touch /src/README.md; \
    /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/dist /src

# ---------------------------------------------------------------- runtime
FROM ${BASE_IMAGE} AS runtime
ARG VARIANT
SHELL ["/bin/bash", "-e", "-o", "pipefail", "-c"]
# tini as PID 1 forwards SIGTERM to the launcher and reaps orphans; most bases lack it. The CUDA
# image also needs a C compiler and Python's headers: Triton (torch.compile on CUDA) builds its
# kernel launchers with them at run time. And rdma-core's userspace (libibverbs with its
# providers, librdmacm), which NCCL's InfiniBand/RoCE transport opens at start: without it NCCL
# uses TCP sockets between nodes even where the pod has RDMA devices (docs/network.md).
# hadolint ignore=DL3008
RUN packages=(); \
    command -v tini > /dev/null || packages+=(tini); \
    if [ "${VARIANT}" != cpu ]; then \
      packages+=(libibverbs1 ibverbs-providers librdmacm1); \
      command -v gcc > /dev/null || packages+=(gcc libc6-dev); \
      python3 -c 'import pathlib, sys, sysconfig; sys.exit(not pathlib.Path(sysconfig.get_paths()["include"], "Python.h").is_file())' \
        || packages+=(python3-dev); \
    fi; \
    if [ "${#packages[@]}" -gt 0 ]; then \
      apt-get update; \
      apt-get install -y --no-install-recommends "${packages[@]}"; \
      rm -rf /var/lib/apt/lists/*; \
    fi; \
    getent group 1000 > /dev/null || echo "kubeddp:x:1000:" >> /etc/group; \
    getent passwd 1000 > /dev/null \
      || echo "kubeddp:x:1000:1000:kubeddp:/tmp:/usr/sbin/nologin" >> /etc/passwd; \
    mkdir -p /checkpoints /etc/kubeddp; \
    chown 1000:1000 /checkpoints; \
    chmod 0775 /checkpoints
COPY --from=build /opt/venv /opt/venv
COPY --from=build /tmp/dist/ /tmp/dist/
RUN /opt/venv/bin/pip install --no-cache-dir --no-index --no-deps /tmp/dist/*.whl; \
    rm -rf /tmp/dist; \
    /opt/venv/bin/pip check; \
    /opt/venv/bin/python -c "import kubeddp.trainer.launcher.launch, kubeddp.trainer.worker.loop, kubeddp.tools.cli.main"; \
    if [ "${VARIANT}" != cpu ]; then \
      /opt/venv/bin/python -c "import sys, torch; from kubeddp.trainer.worker.compiled import missing_build_tools; missing = missing_build_tools(torch.device('cuda')); sys.exit(missing and f'the CUDA image lacks {missing}')"; \
    fi

# Every path written at run time lies under /tmp or /checkpoints, so the container runs with
# a read-only root filesystem (mount a tmpfs at /tmp and a volume at /checkpoints).
ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    TORCHINDUCTOR_CACHE_DIR=/tmp/torchinductor \
    TRITON_CACHE_DIR=/tmp/triton \
    MPLCONFIGDIR=/tmp/matplotlib
WORKDIR /tmp
EXPOSE 8479
USER 1000:1000
ENTRYPOINT ["tini", "--", "kubeddp", "launch"]
# No arguments: the built-in workload with its default config.
CMD []

FROM runtime AS runtime-cuda

# The EFA variant: the CUDA image plus AWS's EFA userspace for NCCL on EFA (p4d, p5, p5en, ...):
# libfabric with the efa provider, AWS's rdma-core build (it replaces Debian's), and the AWS OFI
# NCCL plugin, all from one EFA installer release, the way AWS's own images install it (no
# kernel module, no limits file, no device check: a container has none of them). The tarball
# is pinned by sha256. Open MPI is left out: torchrun starts the processes.
FROM runtime AS runtime-efa
ARG VARIANT
ARG EFA_INSTALLER_VERSION=1.50.0
ARG EFA_INSTALLER_SHA256=fa6dff8593d866866c13cb4640d9059835cd4efa427971f100ab40c97bef2841
SHELL ["/bin/bash", "-e", "-o", "pipefail", "-c"]
USER 0
# A builder without BuildKit builds every stage: this one does nothing unless VARIANT=efa.
# The plugin links hwloc (aws-ofi-nccl's README: libfabric and hwloc are its dependencies).
# hadolint ignore=DL3008
RUN if [ "${VARIANT}" != efa ]; then exit 0; fi; \
    mkdir -p /tmp/efa; \
    /opt/venv/bin/python -c "import hashlib, sys, urllib.request; url, path, want = sys.argv[1:]; urllib.request.urlretrieve(url, path); got = hashlib.sha256(open(path, 'rb').read()).hexdigest(); sys.exit(None if got == want else f'{url}: sha256 {got}, expected {want}')" \
      "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
      /tmp/efa/installer.tar.gz "${EFA_INSTALLER_SHA256}"; \
    tar -xzf /tmp/efa/installer.tar.gz -C /tmp/efa; \
    apt-get update; \
    apt-get install -y --no-install-recommends libhwloc15; \
    env -C /tmp/efa/aws-efa-installer ./efa_installer.sh -y --skip-kmod --skip-limit-conf --no-verify --skip-mpi; \
    rm -rf /tmp/efa /var/lib/apt/lists/*; \
    plugin="$(find /opt/amazon -name libnccl-net.so -print -quit)"; \
    test -n "${plugin}" || { echo "the EFA installer left no libnccl-net.so under /opt/amazon" >&2; exit 1; }; \
    ln -s "$(dirname "${plugin}")" /opt/amazon/ofi-nccl-lib; \
    missing="$(LD_LIBRARY_PATH=/opt/amazon/ofi-nccl-lib:/opt/amazon/efa/lib ldd "${plugin}" | grep 'not found' | grep -v libcuda || true)"; \
    test -z "${missing}" || { echo "the NCCL net plugin misses: ${missing}" >&2; exit 1; }
# NCCL opens the plugin (libnccl-net.so) and the plugin libfabric on this path. Every library
# they need is in the image but the driver's libcuda, which the NVIDIA runtime mounts.
ENV LD_LIBRARY_PATH=/opt/amazon/ofi-nccl-lib:/opt/amazon/efa/lib
USER 1000:1000

FROM runtime AS runtime-cpu
# A bare `docker run` of the CPU image trains with 2 workers (nproc auto -> this count).
ENV KUBEDDP_CPU_NPROC=2

# ---------------------------------------------------------------- the image
# hadolint ignore=DL3006
FROM runtime-${VARIANT}
ARG BASE_IMAGE
ARG VARIANT
ARG TORCH_VERSION=2.13.0
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="kubeddp" \
      org.opencontainers.image.description="PyTorch DDP training on Kubernetes: launcher, trainer, metrics (${VARIANT}, torch ${TORCH_VERSION})" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kubeddp/kubeddp" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      io.kubeddp.variant="${VARIANT}" \
      io.kubeddp.torch-version="${TORCH_VERSION}"
