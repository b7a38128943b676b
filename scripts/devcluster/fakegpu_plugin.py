"""A kubelet device plugin (API v1beta1) that advertises fake ``nvidia.com/gpu`` devices.

The real node has no GPU, yet the operator's placement rules must meet the real scheduler: this
plugin registers with the kubelet like NVIDIA's does, lists ``--count`` healthy devices and, on
Allocate, hands the container ``NVIDIA_VISIBLE_DEVICES`` naming the devices it got (no device
files: there are none). The gRPC stubs are generated once from the kubelet's own
``api.proto`` in the Debian kubernetes source tree (gogoproto options stripped), cached under
``~/.cache/infertune/deviceplugin``.

    python fakegpu_plugin.py --plugin-dir <kubelet root>/device-plugins --count 2
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from types import ModuleType
from typing import Any

CACHE = Path(os.environ.get("INFERTUNE_CACHE", Path.home() / ".cache" / "infertune"))
SRC_GLOB = "build/kubernetes-*/staging/src/k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto"
API_VERSION = "v1beta1"
RESOURCE = "nvidia.com/gpu"
SOCKET_NAME = "infertune-fakegpu.sock"


def stubs() -> tuple[ModuleType, ModuleType]:
    """(api_pb2, api_pb2_grpc) for the kubelet's deviceplugin v1beta1 proto, generated once."""
    out = CACHE / "deviceplugin"
    if not (out / "api_pb2_grpc.py").exists():
        found = sorted(CACHE.glob(SRC_GLOB))
        if not found:
            raise FileNotFoundError(
                f"no {SRC_GLOB} under {CACHE}: run scripts/devcluster/build.sh first"
            )
        from grpc_tools import protoc

        out.mkdir(parents=True, exist_ok=True)
        text = found[0].read_text()
        # gogoproto only tunes Go code generation; protoc without gogo's .proto cannot import it.
        text = re.sub(
            r'^import "github.com/gogo/protobuf/gogoproto/gogo.proto";\n', "", text, flags=re.M
        )
        text = re.sub(r"^option \(gogoproto\.[^\n]*\n", "", text, flags=re.M)
        (out / "api.proto").write_text(text)
        include = Path(protoc.__file__).parent / "_proto"
        rc = protoc.main(
            ["protoc", f"-I{out}", f"-I{include}", f"--python_out={out}", f"--grpc_python_out={out}",
             str(out / "api.proto")]
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"protoc failed on {out / 'api.proto'} ({rc})")
    sys.path.insert(0, str(out))
    return importlib.import_module("api_pb2"), importlib.import_module("api_pb2_grpc")


def device_ids(count: int) -> list[str]:
    return [f"FAKE-GPU-{i}" for i in range(count)]


def serve(plugin_dir: Path, count: int, stop: threading.Event) -> None:
    """Serve the plugin socket and (re-)register with the kubelet until ``stop`` is set.

    The kubelet forgets plugins when it restarts (its socket is recreated), so registration is
    repeated whenever kubelet.sock changes.
    """
    import grpc

    pb, rpc = stubs()
    ids = device_ids(count)

    class Plugin(rpc.DevicePluginServicer):  # type: ignore[misc,name-defined]
        def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.DevicePluginOptions(pre_start_required=False)

        def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
            yield pb.ListAndWatchResponse(devices=[pb.Device(ID=i, health="Healthy") for i in ids])
            # The stream stays open: closing it tells the kubelet the devices are gone.
            while not stop.is_set() and context.is_active():
                stop.wait(1.0)

        def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.AllocateResponse(
                container_responses=[
                    pb.ContainerAllocateResponse(
                        envs={"NVIDIA_VISIBLE_DEVICES": ",".join(r.devicesIDs)}
                    )
                    for r in request.container_requests
                ]
            )

        def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.PreferredAllocationResponse()

        def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
            return pb.PreStartContainerResponse()

    sock = plugin_dir / SOCKET_NAME
    kubelet_sock = plugin_dir / "kubelet.sock"
    server: Any = None
    registered: float | None = None
    try:
        while not stop.is_set():
            try:
                stamp: float | None = kubelet_sock.stat().st_ctime
            except OSError:
                stamp = None
            if stamp is not None and stamp != registered:
                # A starting kubelet deletes every socket in the directory: serve on a fresh one
                # each time its own socket is (re)created, then register.
                if server is not None:
                    server.stop(0)
                sock.unlink(missing_ok=True)
                server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
                rpc.add_DevicePluginServicer_to_server(Plugin(), server)
                server.add_insecure_port(f"unix://{sock}")
                server.start()
                try:
                    with grpc.insecure_channel(f"unix://{kubelet_sock}") as ch:
                        rpc.RegistrationStub(ch).Register(
                            pb.RegisterRequest(
                                version=API_VERSION, endpoint=SOCKET_NAME, resource_name=RESOURCE,
                                options=pb.DevicePluginOptions(),
                            ),
                            timeout=5,
                        )  # fmt: skip
                    registered = stamp
                    print(f"registered {RESOURCE} x{count} with {kubelet_sock}", flush=True)
                except grpc.RpcError as exc:
                    print(f"register failed (retrying): {exc}", flush=True)
            elif server is not None and not sock.exists():
                registered = None  # our socket was removed: serve and register again
            stop.wait(1.0)
    finally:
        if server is not None:
            server.stop(1)
        sock.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plugin-dir", type=Path, required=True)
    p.add_argument("--count", type=int, default=2)
    p.add_argument("--generate-only", action="store_true", help="generate the stubs and exit")
    args = p.parse_args(argv)
    if args.generate_only:
        stubs()
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    while not args.plugin_dir.is_dir() and not stop.is_set():
        time.sleep(0.2)
    serve(args.plugin_dir, args.count, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
