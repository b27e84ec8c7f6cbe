# raftcron agent image.
#
#   docker build -t raftcron .                    # with network: dependencies from PyPI
#   tests/e2e/build_image.sh                      # offline: local base image + host-built wheels
#
# Works with the official python:3.11-slim (python in /usr/local/bin) and with the local
# stand-in from tests/e2e/build_base_image.sh (Debian's python3 in /usr/bin): everything
# goes into a venv made by `python3 -m venv`, and only that venv reaches the final stage.
#
# Offline builds: the host puts wheels in docker/wheels/deps/ (every dependency) and
# docker/wheels/app/ (raftcron itself). When those folders are missing or empty, pip uses
# the index instead. Only the classic builder's features are used (no BuildKit needed).
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS build
# The classic builder keeps this stage as an untagged image (it is the layer cache); the
# label lets you find it: docker images -f dangling=true -f label=io.raftcron.stage=build
LABEL io.raftcron.stage=build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_ROOT_USER_ACTION=ignore
RUN python3 -m venv /opt/raftcron

# Dependencies first, in their own layer: it changes only with pyproject.toml or the wheels.
# The [s] glob lets the build go on when docker/wheels/deps does not exist.
COPY pyproject.toml docker/wheels/dep[s] /tmp/deps/
RUN set -eu; \
    if ls /tmp/deps/*.whl >/dev/null 2>&1; then \
        /opt/raftcron/bin/pip install --no-index --find-links /tmp/deps /tmp/deps/*.whl; \
    else \
        /opt/raftcron/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("/tmp/deps/pyproject.toml", "rb"))["project"]["dependencies"]))' >/tmp/requirements.txt; \
        /opt/raftcron/bin/pip install -r /tmp/requirements.txt; \
    fi

# The project itself (the context holds only what .dockerignore lets through). Nothing at
# run time needs pip or setuptools (25 MB), so the venv leaves this stage without them.
COPY . /src
RUN set -eu; \
    if ls /src/docker/wheels/app/raftcron-*.whl >/dev/null 2>&1; then \
        /opt/raftcron/bin/pip install --no-index --no-deps /src/docker/wheels/app/raftcron-*.whl; \
    else \
        /opt/raftcron/bin/pip install --no-deps /src; \
    fi; \
    /opt/raftcron/bin/pip check; \
    /opt/raftcron/bin/python -c 'import raftlog, scheduler, api'; \
    /opt/raftcron/bin/pip uninstall --yes --quiet setuptools pip; \
    rm -f /opt/raftcron/bin/pip* /opt/raftcron/bin/easy_install*


FROM ${BASE_IMAGE}
ARG RAFTCRON_UID=10001
ARG RAFTCRON_JOB_UID=10002
LABEL org.opencontainers.image.title="raftcron" \
      org.opencontainers.image.description="A distributed cron on Raft (pysyncobj)" \
      org.opencontainers.image.licenses="Apache-2.0"

# A fixed uid so a named volume keeps the right owner across image rebuilds.
RUN set -eu; \
    groupadd --gid "$RAFTCRON_UID" raftcron; \
    useradd --uid "$RAFTCRON_UID" --gid raftcron --home-dir /var/lib/raftcron \
        --no-create-home --no-log-init --shell /usr/sbin/nologin raftcron; \
    mkdir -p /var/lib/raftcron; \
    chown raftcron:raftcron /var/lib/raftcron; \
    chmod 0700 /var/lib/raftcron; \
    groupadd --gid "$RAFTCRON_JOB_UID" raftcron-job; \
    useradd --uid "$RAFTCRON_JOB_UID" --gid raftcron-job --home-dir /home/raftcron-job \
        --no-create-home --no-log-init --shell /usr/sbin/nologin raftcron-job; \
    mkdir -p /home/raftcron-job; \
    chown raftcron-job:raftcron-job /home/raftcron-job; \
    chmod 0700 /home/raftcron-job

ENV PATH=/opt/raftcron/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    RAFTCRON_DATA_DIR=/var/lib/raftcron

# Everything else comes from RAFTCRON_* variables (RAFTCRON_NODE_ID, RAFTCRON_PEERS,
# RAFTCRON_SECRET or RAFTCRON_SECRET_FILE, ...): see docker-compose.yml. The secret has no
# default on purpose. raftcron-job (above) is the user shell jobs run as with
# RAFTCRON_SHELL_USER=raftcron-job, which needs the agent to run as root (compose does);
# as raftcron, the default user here, leave RAFTCRON_SHELL_USER unset.
VOLUME ["/var/lib/raftcron"]
WORKDIR /var/lib/raftcron
EXPOSE 7001 8001

# GET /v1/health on this node's own HTTP address; a wildcard bind is probed on loopback.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["/opt/raftcron/bin/python", "-c", "import os,urllib.request as u; h,_,p=os.environ.get('RAFTCRON_HTTP_ADDR','127.0.0.1:8001').rpartition(':'); h=h.strip('[]'); h={'':'127.0.0.1','0.0.0.0':'127.0.0.1','::':'::1'}.get(h,h); h='['+h+']' if ':' in h else h; u.build_opener(u.ProxyHandler({})).open('http://%s:%s/v1/health'%(h,p),timeout=2).read()"]

ENTRYPOINT ["raftcron"]
CMD ["agent"]

# Last, so that a code change rebuilds only this layer (each instruction after it would cost
# a container commit with the classic builder).
USER raftcron:raftcron
COPY --from=build /opt/raftcron /opt/raftcron
