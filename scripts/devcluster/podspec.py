"""Turn a pod's container spec into a local process description: argv, env, cwd and paths.

Volumes are materialised under the pod's directory, and because a local process cannot see a
mount namespace, every volumeMount's ``mountPath`` prefix found in command, args, env values and
workingDir is rewritten to the local directory (on a path boundary, longest mount first). The full
mapping is also passed as JSON in ``INFERTUNE_PATH_MAP`` for programs that build paths themselves.
``terminationMessagePath`` (default /dev/termination-log) is mapped the same way to a per-container
file which the agent reads back into ``state.terminated.message``.
"""

from __future__ import annotations

import base64
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from kubeapi import ApiError, Kube

Obj = dict[str, Any]


class ConfigError(Exception):
    """The pod references something missing (kubelet: CreateContainerConfigError)."""


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion: unknown references stay literal, $$ escapes a dollar."""

    def repl(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))

    return _VAR.sub(repl, text)


def rewrite_paths(text: str, mapping: list[tuple[str, str]]) -> str:
    """Replace mountPath prefixes with local directories, on path boundaries, longest mount first.

    A path below a mount that exists on this machine is left alone: the pod's command is a host
    command (its interpreter may live under /work or /usr), and only a real container would hide it.
    One pass over the text: a local directory written in is never rewritten again (the pods'
    directories live under /dev/shm, itself a pod's mountPath when the pod has a shm volume).
    """
    if not mapping:
        return text
    ordered = sorted(mapping, key=lambda mp: len(mp[0].rstrip("/")), reverse=True)
    mounts = "|".join(re.escape(mount.rstrip("/")) for mount, _ in ordered)
    pattern = r"(?<![\w./-])(" + mounts + r")(/[^\s,:;\"'=]*)?(?=$|[\s,:;\"'=])"
    local_of = {mount.rstrip("/"): local for mount, local in ordered}

    def repl(m: re.Match[str]) -> str:
        mount, rest = m.group(1), m.group(2) or ""
        if rest.strip("/") and os.path.exists(mount + rest):
            return m.group(0)
        return local_of[mount] + rest

    return re.sub(pattern, repl, text)


def _write_keys(
    target: Path, data: dict[str, bytes], items: list[Obj] | None, mode: int | None
) -> None:
    target.mkdir(parents=True, exist_ok=True)
    chosen: list[tuple[str, str, int | None]] = (
        [(str(i["key"]), str(i.get("path", i["key"])), i.get("mode")) for i in items]
        if items
        else [(k, k, None) for k in data]
    )
    for key, rel, item_mode in chosen:
        if key not in data:
            raise ConfigError(f"key {key!r} not found")
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data[key])
        path.chmod(item_mode or mode or 0o644)


def _source_data(
    kube: Kube, namespace: str, kind: str, name: str, optional: bool
) -> dict[str, bytes] | None:
    plural = "configmaps" if kind == "ConfigMap" else "secrets"
    try:
        obj = kube.get(f"/api/v1/namespaces/{namespace}/{plural}/{name}")
    except ApiError as e:
        if e.status == 404:
            if optional:
                return None
            raise ConfigError(f'{kind.lower()} "{name}" not found') from e
        raise
    if kind == "ConfigMap":
        out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return out
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def materialise_volumes(pod: Obj, pod_dir: Path, kube: Kube, pvc_root: Path) -> dict[str, Path]:
    """Create every volume of the pod locally; returns volume name -> local directory."""
    ns = pod["metadata"]["namespace"]
    out: dict[str, Path] = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        local = pod_dir / "volumes" / name
        if "configMap" in vol or "secret" in vol:
            src = vol.get("configMap") or vol.get("secret") or {}
            kind = "ConfigMap" if "configMap" in vol else "Secret"
            data = _source_data(
                kube,
                ns,
                kind,
                src.get("name") or src.get("secretName", ""),
                bool(src.get("optional")),
            )
            _write_keys(local, data or {}, src.get("items"), src.get("defaultMode"))
        elif "emptyDir" in vol:
            local.mkdir(parents=True, exist_ok=True)
        elif "hostPath" in vol:
            local = Path(vol["hostPath"]["path"])
            if vol["hostPath"].get("type") == "DirectoryOrCreate":
                local.mkdir(parents=True, exist_ok=True)
        elif "persistentVolumeClaim" in vol:
            # Claims are directories shared by all pods of this cluster instance and kept across
            # pod restarts, which is what a study database on a PVC needs.
            local = pvc_root / ns / vol["persistentVolumeClaim"]["claimName"]
            local.mkdir(parents=True, exist_ok=True)
        elif "projected" in vol:
            for source in vol["projected"].get("sources") or []:
                for kind, key in (("ConfigMap", "configMap"), ("Secret", "secret")):
                    if key in source:
                        s = source[key]
                        data = _source_data(
                            kube, ns, kind, s.get("name", ""), bool(s.get("optional"))
                        )
                        _write_keys(
                            local, data or {}, s.get("items"), vol["projected"].get("defaultMode")
                        )
            local.mkdir(parents=True, exist_ok=True)
        elif "downwardAPI" in vol:
            local.mkdir(parents=True, exist_ok=True)
            for item in vol["downwardAPI"].get("items") or []:
                if "fieldRef" in item:
                    value = field_value(pod, item["fieldRef"]["fieldPath"])
                    (local / item["path"]).write_text(value)
        else:
            kinds = sorted(k for k in vol if k != "name")
            raise ConfigError(
                f"volume {name!r} of type {kinds} is not supported by the node agent "
                "(supported: configMap, secret, emptyDir, hostPath, persistentVolumeClaim, projected, downwardAPI)"
            )
        out[name] = local
    return out


def field_value(pod: Obj, path: str) -> str:
    meta, status, spec = pod["metadata"], pod.get("status") or {}, pod["spec"]
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return str((meta.get(m.group(1)) or {}).get(m.group(2), ""))
    values = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": ",".join(i["ip"] for i in status.get("podIPs") or []),
    }
    if path not in values:
        raise ConfigError(
            f"fieldRef {path!r} is not supported (supported: {', '.join(values)}, metadata.labels/annotations['k'])"
        )
    return str(values[path])


def _resource_value(container: Obj, ref: Obj) -> str:
    kind, _, name = ref["resource"].partition(".")
    q = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if q is None:
        return "0"
    from scheduling import parse_quantity

    divisor = parse_quantity(ref.get("divisor") or "1")
    value = parse_quantity(q) / divisor
    return str(int(-(-value // 1)))  # kubelet rounds up


def container_env(pod: Obj, container: Obj, kube: Kube, base: dict[str, str]) -> dict[str, str]:
    """Base env, then envFrom, then env in order, each value $(VAR)-expanded against what came before."""
    ns = pod["metadata"]["namespace"]
    env = dict(base)
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        ref = src.get("configMapRef") or src.get("secretRef") or {}
        kind = "ConfigMap" if "configMapRef" in src else "Secret"
        data = _source_data(kube, ns, kind, ref.get("name", ""), bool(ref.get("optional")))
        for k, v in (data or {}).items():
            env[prefix + k] = v.decode(errors="replace")
    for item in container.get("env") or []:
        name = item["name"]
        if "valueFrom" not in item:
            env[name] = expand(item.get("value", ""), env)
            continue
        vf = item["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_value(pod, vf["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in vf:
            env[name] = _resource_value(container, vf["resourceFieldRef"])
        else:
            kind, ref = (
                ("ConfigMap", vf["configMapKeyRef"])
                if "configMapKeyRef" in vf
                else ("Secret", vf["secretKeyRef"])
            )
            data = _source_data(kube, ns, kind, ref["name"], bool(ref.get("optional")))
            if data is None:
                continue
            if ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise ConfigError(f"couldn't find key {ref['key']} in {kind} {ns}/{ref['name']}")
            env[name] = data[ref["key"]].decode(errors="replace")
    return env


def path_mapping(container: Obj, volumes: dict[str, Path], pod_dir: Path) -> list[tuple[str, str]]:
    mapping: list[tuple[str, str]] = []
    for m in container.get("volumeMounts") or []:
        local = volumes.get(m["name"])
        if local is None:
            raise ConfigError(f"volumeMount {m['name']!r} names no volume of the pod")
        if m.get("subPath"):
            local = local / m["subPath"]
            local.mkdir(parents=True, exist_ok=True)
        mapping.append((m["mountPath"].rstrip("/") or "/", str(local)))
    term = container.get("terminationMessagePath") or "/dev/termination-log"
    mapping.append((term, str(pod_dir / f"{container['name']}.termination-log")))
    return sorted(mapping, key=lambda mp: len(mp[0]), reverse=True)


def process_spec(
    pod: Obj, container: Obj, env: dict[str, str], mapping: list[tuple[str, str]], pod_dir: Path,
    image_commands: dict[str, list[str]],
) -> tuple[list[str], dict[str, str], Path]:  # fmt: skip
    """argv, env and cwd for the container's process."""
    env = {k: rewrite_paths(v, mapping) for k, v in env.items()}
    env["INFERTUNE_PATH_MAP"] = json.dumps(dict(mapping))
    command = container.get("command") or image_commands.get(container.get("image", ""))
    if not command:
        raise ConfigError(
            f"container {container['name']!r} has no command and image {container.get('image')!r} is not in the "
            "node agent's image_commands: a local process cannot run an image entrypoint"
        )
    argv = [
        rewrite_paths(expand(a, env), mapping) for a in [*command, *(container.get("args") or [])]
    ]
    cwd = pod_dir
    if container.get("workingDir"):
        wd = Path(rewrite_paths(container["workingDir"], mapping))
        cwd = wd if wd.is_dir() else cwd
    return argv, env, cwd


def base_env(pod: Obj, pod_ip: str, api_host: str, api_port: int) -> dict[str, str]:
    """The agent's own environment (PATH, venv...) minus its credentials, plus what a kubelet adds.

    The agent's virtualenv stands in for the container image: its ``bin`` leads PATH, so a pod
    whose command is the image's ``infertune`` (an operator run without ``--infertune-command``,
    as in a real cluster) runs this checkout's CLI, not "No such file or directory".
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBECONFIG", "KUBERNETES_"))}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(
        [venv_bin, *(p for p in env.get("PATH", "").split(os.pathsep) if p and p != venv_bin)]
    )
    env.update(
        HOSTNAME=pod["metadata"]["name"],
        POD_IP=pod_ip,
        KUBERNETES_SERVICE_HOST=api_host,
        KUBERNETES_SERVICE_PORT=str(api_port),
    )
    return env
