#!/usr/bin/env bash
# Build a local stand-in for the official `python:3.11-slim` image and tag it.
#
# Why: the machines this project runs on cannot pull from any container registry, so the
# engine starts with no images at all. Debian's package mirror is reachable, so we
# debootstrap a minimal bookworm (python3 3.11) and `docker import` it.
#
# Usage: tests/e2e/build_base_image.sh [--force] [TAG]
#   TAG defaults to $RAFTCRON_BASE_IMAGE or raftcron-base:bookworm-py311.
#   Idempotent: does nothing when TAG already exists (use --force to rebuild).
# Env:
#   RAFTCRON_DEBIAN_MIRROR  mirror URL (default: the Debian mirror apt already uses here)
#   RAFTCRON_BUILD_TMP      scratch folder parent (default /var/tmp)
#
# Needs root (debootstrap) and ~300 MB of scratch space. Touches only the image TAG.
set -euo pipefail

force=0
tag=""
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        -*) echo "error: unknown option $arg" >&2; exit 2 ;;
        *) tag="$arg" ;;
    esac
done
tag="${tag:-${RAFTCRON_BASE_IMAGE:-raftcron-base:bookworm-py311}}"
case "$tag" in
    raftcron*) ;;
    *) echo "error: refusing to tag '$tag': our images are named raftcron*" >&2; exit 2 ;;
esac

log() { printf '[build_base_image] %s\n' "$*" >&2; }

if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
    log "$tag exists; nothing to do (use --force to rebuild)"
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "error: debootstrap needs root" >&2
    exit 1
fi

if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap with apt-get"
    # Bounded: apt has its own network timeouts; `timeout` caps the whole step.
    timeout 600 apt-get update -qq
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq debootstrap >/dev/null
fi

# The mirror apt already uses on this host (deb822 `URIs:` or one-line `deb URL suite`),
# keeping only plain Debian archives (not -security, not third-party repositories).
find_mirror() {
    local files=() f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] && files+=("$f")
    done
    [ "${#files[@]}" -gt 0 ] || return 0
    {
        grep -hE '^[[:space:]]*URIs:' "${files[@]}" | sed -E 's/^[[:space:]]*URIs:[[:space:]]*//' | tr ' ' '\n'
        grep -hE '^[[:space:]]*deb[[:space:]]' "${files[@]}" \
            | sed -E 's/^[[:space:]]*deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' | awk '{print $1}'
    } | grep -E '^https?://.*/debian/?$' | head -n1 || true
}
mirror="${RAFTCRON_DEBIAN_MIRROR:-$(find_mirror)}"
mirror="${mirror:-http://deb.debian.org/debian}"

scratch_parent="${RAFTCRON_BUILD_TMP:-/var/tmp}"
work="$(mktemp -d "$scratch_parent/raftcron-base.XXXXXX")"
root="$work/rootfs"

# Unmount anything debootstrap left mounted inside the target before deleting it: never
# rm -rf through a bind mount of the host's /dev or /proc.
cleanup() {
    local m
    for _ in 1 2 3; do
        m="$(findmnt -rn -o TARGET | grep -F "$root" | sort -r || true)"
        [ -z "$m" ] && break
        while read -r t; do umount "$t" 2>/dev/null || umount -l "$t" 2>/dev/null || true; done <<<"$m"
    done
    if findmnt -rn -o TARGET | grep -qF "$root"; then
        log "WARNING: mounts remain under $root; not deleting $work"
        return
    fi
    rm -rf "$work"
}
trap cleanup EXIT

start=$(date +%s)
log "debootstrap bookworm from $mirror into $root"
# python3-venv brings ensurepip's bundled pip; netbase and tzdata as in the official image.
timeout 1200 debootstrap --variant=minbase \
    --include=python3,python3-venv,ca-certificates,netbase,tzdata \
    bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
        tail -n 30 "$work/debootstrap.log" >&2
        echo "error: debootstrap failed (log above)" >&2
        exit 1
    }
log "debootstrap done in $(( $(date +%s) - start ))s"

# Make the stand-in look like python:3.11-slim where it matters: python3/python on
# /usr/local/bin, UTF-8 locale, no docs, no caches, and dpkg told to skip docs next time.
ln -sf /usr/bin/python3 "$root/usr/local/bin/python3"
ln -sf /usr/bin/python3 "$root/usr/local/bin/python"
cat >"$root/etc/dpkg/dpkg.cfg.d/docker-minimal" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
cat >"$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
Acquire::GzipIndexes "true";
EOF
find "$root/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/lintian \
       "$root"/usr/share/locale/* \
       "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
       "$root"/var/cache/debconf/*-old "$root"/var/lib/apt/lists/* \
       "$root"/var/lib/dpkg/*-old "$root"/var/log/* "$root"/tmp/* "$root"/var/tmp/* \
       "$root"/root/.cache
# Docker provides these at run time; do not bake the host's into the image.
rm -f "$root/etc/resolv.conf" "$root/etc/hostname" "$root/etc/hosts"
: >"$root/etc/machine-id" 2>/dev/null || true

log "importing as $tag"
py_version="$(chroot "$root" /usr/bin/python3 -c 'import platform;print(platform.python_version())')"
tar -C "$root" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
    | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change "ENV PYTHON_VERSION=$py_version" \
        --change 'LABEL org.opencontainers.image.title=raftcron-base org.opencontainers.image.description="debootstrap bookworm minbase + python3; stand-in for python:3.11-slim"' \
        --change 'CMD ["python3"]' \
        --message "debootstrap --variant=minbase bookworm + python3 $py_version" \
        - "$tag" >/dev/null

log "built $tag (python $py_version) in $(( $(date +%s) - start ))s; $(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1/1e6}')"
