"""budget.parallelTrials > 1 on an operator with no shared study storage (the chart's default,
storage.type=sqlite): the real operator refuses the spec and says why, on the object and in an
Event, and starts no tuning Job (each pod's SQLite study would run the whole budget alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from operator_harness import OperatorProcess
from test_operator_flow import apply, condition, demo, jobs, wait_phase

pytestmark = pytest.mark.cluster


def test_parallel_trials_without_shared_storage_is_refused_with_the_reason(
    cluster: Any, api: Any, namespace: str, operator: OperatorProcess, tmp_path: Path
) -> None:
    apply(cluster, namespace, demo("parallel-sqlite", budget={"maxTrials": 8, "parallelTrials": 2}), tmp_path)  # fmt: skip
    obj = wait_phase(api, namespace, "parallel-sqlite", ("Invalid",), operator, timeout=60)
    ready = condition(obj, "Ready")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec", ready
    assert "parallelTrials: 2 workers share one study" in ready["message"]
    assert "storage.type=postgresql" in ready["message"]
    events = client.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector="involvedObject.name=parallel-sqlite"
    )
    assert any(e.reason == "InvalidSpec" and "parallelTrials" in e.message for e in events.items)
    assert not jobs(api, namespace, "parallel-sqlite")
