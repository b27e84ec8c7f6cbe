#!/usr/bin/env bash
# Build the raftcron image without any container registry.
#
# Usage: tests/e2e/build_image.sh [TAG]            (TAG defaults to raftcron:dev)
#
# 1. the base image: tests/e2e/build_base_image.sh (skipped when the tag exists), unless
#    RAFTCRON_BASE_IMAGE names another image that is already present (python:3.11-slim ...);
# 2. wheels on the host, from PyPI, into docker/wheels/deps (every dependency) and
#    docker/wheels/app (raftcron), so the image build needs no network;
# 3. docker build --build-arg BASE_IMAGE=... -t TAG .
# 4. a smoke check of the image; then `compose config` on the compose files.
#
# Env: RAFTCRON_BASE_IMAGE (default raftcron-base:bookworm-py311), PYTHON (a Python 3.11
# used to build the wheels; default python3), RAFTCRON_SKIP_WHEELS=1 (reuse docker/wheels
# as it is, e.g. with no network to PyPI).
# Touches only the images TAG and the base tag; writes only under docker/wheels/.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
tag="${1:-raftcron:dev}"
base="${RAFTCRON_BASE_IMAGE:-raftcron-base:bookworm-py311}"
python="${PYTHON:-python3}"
wheels="$repo/docker/wheels"

case "$tag" in
    raftcron*) ;;
    *) echo "error: refusing to tag '$tag': our images are named raftcron*" >&2; exit 2 ;;
esac

log() { printf '[build_image] %s\n' "$*" >&2; }

# `docker compose` (v2 plugin) when it works, else the v1 `docker-compose`.
compose() {
    if docker compose version >/dev/null 2>&1; then
        docker compose "$@"
    elif command -v docker-compose >/dev/null 2>&1; then
        docker-compose "$@"
    else
        echo "error: neither 'docker compose' nor 'docker-compose' is installed" >&2
        return 127
    fi
}

t0=$(date +%s)

# 1. base image
case "$base" in
    raftcron-base*) "$here/build_base_image.sh" "$base" ;;
    *)
        if ! docker image inspect "$base" >/dev/null 2>&1; then
            echo "error: base image $base is not present and no registry can be reached;" \
                 "unset RAFTCRON_BASE_IMAGE to build the local stand-in" >&2
            exit 1
        fi ;;
esac
t1=$(date +%s)

# 2. wheels. Built from a copy of the sources so setuptools leaves no build/ or *.egg-info
# in the work tree; SOURCE_DATE_EPOCH makes the raftcron wheel byte-identical while the code
# is, so an unchanged tree keeps docker's layer cache.
if [ "${RAFTCRON_SKIP_WHEELS:-0}" = 1 ]; then
    log "RAFTCRON_SKIP_WHEELS=1: using docker/wheels as it is"
else
    if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        echo "error: $python is not Python 3.11; the image's python is 3.11 and wheels must" \
             "match it (set PYTHON=/path/to/python3.11, or RAFTCRON_SKIP_WHEELS=1)" >&2
        exit 1
    fi
    tmp="$(mktemp -d "${TMPDIR:-/tmp}/raftcron-wheels.XXXXXX")"
    trap 'rm -rf "$tmp"' EXIT
    mkdir -p "$tmp/src" "$tmp/out"
    (cd "$repo" && for f in pyproject.toml setup.cfg setup.py README.md LICENSE raftlog scheduler api; do
        [ -e "$f" ] && printf '%s\0' "$f"; done) \
        | tar -C "$repo" --exclude='__pycache__' --exclude='*.py[cod]' --exclude='*.egg-info' --null -T - -cf - \
        | tar -C "$tmp/src" -xf -
    log "pip wheel (project and all dependencies) with $("$python" -V 2>&1)"
    SOURCE_DATE_EPOCH=315532800 timeout 900 "$python" -m pip wheel --quiet \
        --disable-pip-version-check --wheel-dir "$tmp/out" "$tmp/src"
    mkdir -p "$tmp/deps" "$tmp/app"
    mv "$tmp"/out/raftcron-*.whl "$tmp/app/"
    mv "$tmp"/out/*.whl "$tmp/deps/"
    mkdir -p "$wheels"
    rm -rf "$wheels/deps" "$wheels/app"
    mv "$tmp/deps" "$tmp/app" "$wheels/"
fi
if ! ls "$wheels"/deps/*.whl >/dev/null 2>&1 || ! ls "$wheels"/app/raftcron-*.whl >/dev/null 2>&1; then
    echo "error: no wheels in $wheels/{deps,app}; the offline image build needs them" >&2
    exit 1
fi
log "wheels: $(find "$wheels/deps" -name '*.whl' | wc -l) dependencies + $(cd "$wheels/app" && echo raftcron-*.whl) ($(du -sh "$wheels" | cut -f1))"
t2=$(date +%s)

# 3. image. Classic builder unless the caller chose (this machine has no buildx).
log "docker build -t $tag (BASE_IMAGE=$base)"
if ! docker buildx version >/dev/null 2>&1; then
    export DOCKER_BUILDKIT="${DOCKER_BUILDKIT:-0}"
fi
old_id="$(docker image inspect -f '{{.Id}}' "$tag" 2>/dev/null || true)"
timeout 1200 docker build --force-rm --build-arg "BASE_IMAGE=$base" -t "$tag" -f "$repo/Dockerfile" "$repo"
t3=$(date +%s)

# Our own leftovers only: the image that TAG named before (if now untagged and unused) and
# all but the newest untagged build stage (the classic builder keeps them; the newest is the
# layer cache for the next build). Never a prune.
new_id="$(docker image inspect -f '{{.Id}}' "$tag")"
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ] \
        && [ "$(docker image inspect -f '{{len .RepoTags}}' "$old_id" 2>/dev/null)" = 0 ]; then
    docker rmi "$old_id" >/dev/null 2>&1 || true
fi
docker images --no-trunc -f dangling=true -f label=io.raftcron.stage=build \
        --format '{{.CreatedAt}}	{{.ID}}' | sort -r | tail -n +2 | cut -f2 \
    | while read -r id; do docker rmi "$id" >/dev/null 2>&1 || true; done

# 4. smoke checks
docker run --rm --entrypoint python3 "$tag" -c 'import msgpack, pysyncobj, aiohttp, croniter, yaml, cryptography, raftlog, scheduler, api'
if docker run --rm --entrypoint python3 "$tag" -c 'import api.cli' >/dev/null 2>&1; then
    docker run --rm "$tag" --help >/dev/null
    log "raftcron --help runs in the image"
else
    log "api.cli not importable yet: checked the dependencies only"
fi
# The compose files must parse (the secret only has to be set for that, not real).
RAFTCRON_SECRET="${RAFTCRON_SECRET:-config-check-only}" compose -f "$repo/docker-compose.yml" config -q
RAFTCRON_SECRET="${RAFTCRON_SECRET:-config-check-only}" \
    compose -f "$repo/docker-compose.yml" -f "$repo/docker-compose.five.yml" config -q
log "compose files parse ($(compose version --short 2>/dev/null || compose version | head -n1))"

log "done: $tag $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}');" \
    "base $((t1 - t0))s, wheels $((t2 - t1))s, image $((t3 - t2))s, total $(( $(date +%s) - t0 ))s"
