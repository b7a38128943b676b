"""Start-up time and resident memory of the dev control plane (etcd + apiserver + controller manager).

Cold = first start of a fresh instance (new etcd data dir, certificates, RBAC bootstrap); the
build is not included (binaries cached by scripts/devcluster/build.sh). Memory is VmRSS after the
controller manager has synced and the fake nodes are registered, i.e. what a test session holds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
# Benchmarks are scripts (run.py, or one at a time), outside pytest and its `pythonpath`: the dev
# cluster is a folder of modules, not a package, so it goes on the path here.
sys.path.insert(0, str(ROOT / "scripts" / "devcluster"))

import devcluster  # noqa: E402
import node_agent  # noqa: E402

CRD = ROOT / "crds" / "inferenceservices.infertune.dev.yaml"
MIB = 1024 * 1024


class StartRun(NamedTuple):  # not a dataclass: run.py loads this file outside sys.modules
    timings: dict[str, float]
    rss: dict[str, int]
    pod_s: float
    stop_s: float


def _one_start() -> StartRun:
    cluster = devcluster.Cluster()
    t0 = time.monotonic()
    try:
        cluster.start()
        t_api = time.monotonic() - t0
        if CRD.exists():
            cluster.kubectl("apply", "-f", str(CRD))
            cluster.kubectl("wait", "--for=condition=Established", "--timeout=60s", "-f", str(CRD))
        t_crd = time.monotonic() - t0
        cluster.start_controller_manager()
        cluster.start_node_agent(node_agent.default_nodes())
        t_all = time.monotonic() - t0
        # Pod round trip: create -> bound -> process ran -> Succeeded reported.
        t_pod = time.monotonic()
        cluster.kubectl(
            "run", "probe", "--image=local", "--restart=Never", "--command", "--", "true"
        )
        cluster.kubectl(
            "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/probe", "--timeout=60s"
        )
        pod_s = time.monotonic() - t_pod
        time.sleep(2)  # let informers settle before reading memory
        rss = cluster.rss_bytes()
        timings = {
            "etcd": cluster.timings["etcd_s"],
            "apiserver": t_api,
            "crd": t_crd,
            "all": t_all,
        }
    finally:
        t_stop = time.monotonic()
        cluster.stop()
        stop_s = time.monotonic() - t_stop
    return StartRun(timings, rss, pod_s, stop_s)


def run() -> list[dict[str, Any]]:
    devcluster.build()
    runs = [_one_start() for _ in range(2)]
    best = {k: min(r.timings[k] for r in runs) for k in runs[0].timings}
    rss = runs[-1].rss
    total = sum(rss.values())
    return [
        {
            "name": "etcd healthy",
            "value": best["etcd"],
            "unit": "s",
            "note": "best of 2 cold starts",
        },
        {
            "name": "apiserver ready (/readyz)",
            "value": best["apiserver"],
            "unit": "s",
            "note": "incl. certs + etcd",
        },
        {
            "name": "CRD established",
            "value": best["crd"],
            "unit": "s",
            "note": "kubectl apply + wait",
        },
        {
            "name": "full start (KCM synced, nodes)",
            "value": best["all"],
            "unit": "s",
            "note": "what the test fixture waits for",
        },
        {
            "name": "pod create->Succeeded",
            "value": min(r.pod_s for r in runs),
            "unit": "s",
            "note": "kubectl run ... true",
        },
        {
            "name": "stop",
            "value": min(r.stop_s for r in runs),
            "unit": "s",
            "note": "all processes gone, state removed",
        },
        *(
            {"name": f"RSS {name}", "value": b / MIB, "unit": "MiB", "note": ""}
            for name, b in sorted(rss.items())
        ),
        {
            "name": "RSS control plane total",
            "value": total / MIB,
            "unit": "MiB",
            "note": "etcd + apiserver + KCM",
        },
    ]


if __name__ == "__main__":
    for row in run():
        print(row)
