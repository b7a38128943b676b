#!/usr/bin/env bash
# Install what a real dev-cluster node needs from Debian packages (once per machine; a warm
# machine returns at once): containerd, runc, the CNI plugins, iptables/conntrack for kube-proxy,
# buildah + mmdebstrap for the project's images. Then builds kubelet, kube-scheduler and
# kube-proxy (build.sh node). Needs root (or sudo).
set -euo pipefail
PKGS=(containerd runc containernetworking-plugins iptables conntrack buildah mmdebstrap uidmap)
SUDO=""; [[ $(id -u) == 0 ]] || SUDO=sudo
missing=()
for p in "${PKGS[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
    echo "[setup_node] apt-get install ${missing[*]}" >&2
    $SUDO apt-get update -qq || true
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
# Debian's containerd package enables a systemd unit; the dev cluster runs its own instance with
# a private socket and state, so a system containerd (if any) is left as it is.
exec bash "$(dirname "$0")/build.sh" node
