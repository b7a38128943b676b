"""How each engine's image runs in a pod: its user, whether its root filesystem can be read-only,
and where it writes (caches on emptyDir volumes). One table, one row per engine; the operator's
settings (the chart's `engines.<name>.runtime`) override any field of a row.

The rows describe the images the operator deploys by default (settings.DEFAULT_ENGINE_IMAGES):

- builtin: the project's own image, `USER 65532`, writes only its caches: non-root, read-only root.
- vllm (`vllm/vllm-openai`) and sglang (`lmsysorg/sglang`): no USER in the image, software under
  /root, and torch looks the uid up in /etc/passwd at import (an arbitrary uid fails), so they run
  as the image's user, root -- still with no capabilities, no privilege escalation and seccomp
  RuntimeDefault -- and a writable root filesystem (their kernels compile and cache at run time).
  Their caches are pointed at an emptyDir all the same, and /dev/shm is a memory emptyDir (NCCL and
  torch's worker processes need more than the runtime's 64 MiB).
- llamacpp: a single binary that writes nothing but /tmp: any uid, read-only root.

The chart deploys the project's tuner-full image for vllm and sglang (USER 65532, the images the
tuner measured in), and says so in values.yaml: `runtime: {runAsUser: 65532,
readOnlyRootFilesystem: true, python: /opt/engines/<engine>/bin/python}`. `python` is the
interpreter that has the engine in that image: the upstream images have one Python (`python3`),
tuner-full has one venv per engine (docker/Dockerfile.tuner) and no `python3` that has both.

/dev/shm is a memory-backed emptyDir capped at half the pod's memory (`shm_size_limit`): memory
pages written there count against the container's limit, so the cap leaves the engine's own
process the other half; NCCL's intra-node buffers and vLLM's broadcast queue with tensor
parallelism live there, and the container runtime's default is 64 MiB.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from infertune.tuner.api.base import to_camel

NONROOT_UID = 65532
CACHE_DIR = "/var/cache/infertune"
TMP_DIR = "/tmp"  # noqa: S108 - an emptyDir, private to the pod
SHM_DIR = "/dev/shm"  # noqa: S108 - a memory emptyDir, private to the pod


class EngineRuntime(BaseModel):
    """One engine image's user, root filesystem, writable paths and cache environment."""

    model_config = ConfigDict(
        extra="forbid", frozen=True, alias_generator=to_camel, populate_by_name=True
    )

    run_as_user: int | None = Field(
        default=NONROOT_UID, ge=0, description="The image's uid; null: the image needs root."
    )
    read_only_root_filesystem: bool = True
    home: str = TMP_DIR
    writable_paths: tuple[str, ...] = Field(
        default=(TMP_DIR, CACHE_DIR), description="Each gets its own emptyDir."
    )
    shm: bool = Field(default=False, description="Shared memory on a memory-backed emptyDir.")
    python: str = Field(
        default="python3",
        min_length=1,
        description="The image's interpreter that has the engine (`<python> -m <module>`).",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Cache locations and the like.")

    @property
    def non_root(self) -> bool:
        return self.run_as_user is not None and self.run_as_user != 0

    def merged(self, override: dict[str, Any]) -> EngineRuntime:
        """This row with the fields `override` sets (camelCase or snake_case) replaced."""
        fields = {to_camel(k): v for k, v in override.items()}
        return EngineRuntime.model_validate({**self.model_dump(by_alias=True), **fields})


_CACHES = {
    "XDG_CACHE_HOME": CACHE_DIR,
    "HF_HOME": f"{CACHE_DIR}/huggingface",
    "TRITON_CACHE_DIR": f"{CACHE_DIR}/triton",
}
_TORCH_CACHES = {
    **_CACHES,
    "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_DIR}/torchinductor",
    "NUMBA_CACHE_DIR": f"{CACHE_DIR}/numba",
}

# The project's own images (engine, tuner, tuner-full): USER 65532, every write under these paths.
PROJECT_IMAGE = EngineRuntime(env=dict(_CACHES))

# The tuning pod: the project's tuner image, which starts vLLM and SGLang trials itself, so it
# needs the engines' /dev/shm as well.
TUNING_POD = PROJECT_IMAGE.model_copy(update={"shm": True})

ENGINE_RUNTIMES: dict[str, EngineRuntime] = {
    "builtin": PROJECT_IMAGE,
    "vllm": EngineRuntime(
        run_as_user=None,
        read_only_root_filesystem=False,
        home="/root",
        shm=True,
        env={
            **_TORCH_CACHES,
            "VLLM_CACHE_ROOT": f"{CACHE_DIR}/vllm",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        },
    ),
    "sglang": EngineRuntime(
        run_as_user=None,
        read_only_root_filesystem=False,
        home="/root",
        shm=True,
        env={**_TORCH_CACHES, "FLASHINFER_WORKSPACE_BASE": CACHE_DIR},
    ),
    "llamacpp": EngineRuntime(writable_paths=(TMP_DIR,)),
}


def parse_runtime_override(text: str) -> tuple[str, dict[str, Any]]:
    """`ENGINE=JSON` (the chart passes `engines.<name>.runtime` as JSON) -> (engine, fields)."""
    engine, sep, body = text.partition("=")
    if not sep or not engine:
        raise ValueError(f"--engine-runtime {text!r}: write ENGINE=JSON")
    try:
        fields = json.loads(body)
    except ValueError as exc:
        raise ValueError(f"--engine-runtime {engine}: not JSON: {exc}") from exc
    if not isinstance(fields, dict):
        raise ValueError(f"--engine-runtime {engine}: expected a JSON object")
    base = ENGINE_RUNTIMES.get(engine, PROJECT_IMAGE)
    base.merged(fields)  # reject a bad field at start-up, not at the first rollout
    return engine, fields


def pod_security_context(rt: EngineRuntime) -> dict[str, Any]:
    """The pod's part: seccomp always; the image's uid and group (and volume group) when non-root."""
    out: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if rt.non_root:
        out.update(
            runAsNonRoot=True,
            runAsUser=rt.run_as_user,
            runAsGroup=rt.run_as_user,
            fsGroup=rt.run_as_user,
        )
    return out


def container_security_context(rt: EngineRuntime) -> dict[str, Any]:
    """No capabilities and no privilege escalation for every image; the user and a read-only root
    where the image allows them."""
    out: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": rt.read_only_root_filesystem,
        "runAsNonRoot": rt.non_root,
        "capabilities": {"drop": ["ALL"]},
    }
    if rt.non_root:
        out["runAsUser"] = rt.run_as_user
        out["runAsGroup"] = rt.run_as_user
    return out


def _volume_name(path: str) -> str:
    return {TMP_DIR: "tmp", CACHE_DIR: "cache", SHM_DIR: "dshm"}.get(
        path, "w-" + "-".join(p for p in path.lower().split("/") if p)[:60]
    )


_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def memory_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (`8Gi`, `512M`, `1.5Gi`, bytes) in bytes."""
    for suffix, scale in (*_BINARY.items(), *_DECIMAL.items()):
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * scale)
    return int(float(quantity))


def shm_size_limit(memory: str) -> str:
    """The shared-memory volume's cap for a pod of `memory`: half of it, in MiB (see above)."""
    return f"{max(64, memory_bytes(memory) // 2 // 2**20)}Mi"


def shm_volume(memory: str | None) -> dict[str, Any]:
    empty_dir: dict[str, Any] = {"medium": "Memory"}
    if memory:
        empty_dir["sizeLimit"] = shm_size_limit(memory)
    return {"name": "dshm", "emptyDir": empty_dir}


def writable_dirs(
    rt: EngineRuntime, memory: str | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """emptyDirs for the paths the engine writes; (volumes, mounts, env). `memory`: the pod's
    memory, which sizes /dev/shm."""
    vols: list[Any] = [{"name": _volume_name(p), "emptyDir": {}} for p in rt.writable_paths]
    mounts: list[Any] = [{"name": _volume_name(p), "mountPath": p} for p in rt.writable_paths]
    if rt.shm:
        vols.append(shm_volume(memory))
        mounts.append({"name": "dshm", "mountPath": SHM_DIR})
    env = [{"name": "HOME", "value": rt.home}]
    env += [{"name": k, "value": v} for k, v in sorted(rt.env.items())]
    return vols, mounts, env
