"""The demo end to end with the real tuner (`infertune tune`) in the Job and the real engine
serving: slow (a real study on the CPU), so it is not part of the default run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from operator_harness import OperatorProcess, operator_kubeconfig
from test_operator_flow import DEMO, condition, wait_phase

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture
def real_tuner() -> Iterator[None]:
    # Pods inherit the node agent's environment (this process): the pod CLI then runs the real tuner.
    os.environ["INFERTUNE_REAL_TUNER"] = "1"
    yield
    os.environ.pop("INFERTUNE_REAL_TUNER", None)


def test_demo_with_the_real_tuner(
    cluster: Any, api: Any, namespace: str, tmp_path: Any, real_tuner: None
) -> None:
    op = OperatorProcess(operator_kubeconfig(cluster, api, tmp_path), tmp_path / "op.log").start()
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", str(DEMO))
        obj = wait_phase(
            api, namespace, "tiny-demo", ("Serving", "Degraded", "Failed"), op, timeout=1500
        )
        tuned = condition(obj, "Tuned")
        assert obj["status"]["phase"] != "Failed", tuned
        assert tuned["status"] in ("True", "False") and tuned["reason"] in (
            "Tuned",
            "SLOInfeasible",
        )
        assert obj["status"]["tuning"]["trialsCompleted"] >= 1
        assert obj["status"]["profile"]["hardware"]
        assert condition(obj, "RolledOut")["status"] == "True"
    finally:
        op.stop()
