# kubeddp training image: one Dockerfile, CUDA or CPU by build arg.
#
#   docker build -t kubeddp:cuda .                                  # GPU: torch's CUDA wheels
#   docker build -t kubeddp:cpu --build-arg VARIANT=cpu .           # CPU: PyTorch CPU index
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
      cuda) torch_index="${PIP_INDEX_URL}" ;; \
      *) echo "VARIANT=${VARIANT} is not supported: use --build-arg VARIANT=cuda or VARIANT=cpu" >&2; exit 2 ;; \
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
    if [ "${VARIANT}" = cuda ]; then \
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
# kernel launchers with them at run time.
# hadolint ignore=DL3008
RUN packages=(); \
    command -v tini > /dev/null || packages+=(tini); \
    if [ "${VARIANT}" = cuda ]; then \
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
    /opt/venv/bin/python -c "import kubeddp.trainer.launcher.launch, kubeddp.trainer.worker.loop, kubeddp.tools.cli"; \
    if [ "${VARIANT}" = cuda ]; then \
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
