"""The operator's watches meet the 404 that a restarted API server answers for a custom resource
until its CRD informer has synced (kubernetes/kubernetes#71218). kopf ends the whole operator on a
watch error other than 429; the operator's watch that meets one is opened again after a backoff
(resilient_watch.py), and the operator never stops.

test_faults_operator's API-server restart meets this only when the restart races the operator's
reconnect; here a proxy in front of the real API server answers the 404s on purpose, at start-up
and after cutting the live watches, so the race happens every run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fault_helpers import Fault, FaultProxy
from operator_harness import PLURAL, explained, wait_for
from test_faults_operator import HARDWARE, operator_for
from test_operator_flow import apply, demo, jobs

pytestmark = pytest.mark.cluster


@pytest.mark.usefixtures("gate")  # the tuning pods wait: each object keeps its one Job
def test_watches_answered_404_by_a_restarting_api_server_are_started_again(
    cluster: Any, api: Any, namespace: str, tmp_path: Path
) -> None:
    listing = rf"/namespaces/{namespace}/{PLURAL}(\?|$)"  # the list and the watch, not one object
    at_start = Fault("GET", listing, 404, times=2)
    proxy = FaultProxy(cluster.server, cluster.ca_cert, [at_start]).start()
    op = operator_for(cluster, api, namespace, tmp_path, server=proxy.url).start()
    try:
        with explained(op, api, namespace):
            wait_for(
                lambda: len(at_start.injected) == 2 or None, "two 404s at start-up", timeout=60
            )
            apply(cluster, namespace, demo("first", hardware=HARDWARE), tmp_path)
            wait_for(lambda: jobs(api, namespace, "first"), "tuning Job after the 404s", timeout=90)

            # Mid-run: every stream is cut, and the watch that comes back is answered 404 thrice.
            again = Fault("GET", rf"/namespaces/{namespace}/{PLURAL}\?.*watch=", 404, times=3)
            proxy.faults.append(again)
            assert proxy.break_streams() > 0
            wait_for(lambda: len(again.injected) == 3 or None, "three 404s mid-run", timeout=90)
            apply(cluster, namespace, demo("second", hardware=HARDWARE), tmp_path)
            wait_for(lambda: jobs(api, namespace, "second"), "tuning Job after those", timeout=90)

        assert op.proc is not None and op.proc.poll() is None, op.log()[-3000:]
        log = op.log()
        # Each 404 was waited out with a warning, none ended the operator.
        assert log.count("got HTTP 404") == 5, log[-3000:]
        # Listing every object again on the way up repeated no work: still one Job each.
        assert len(jobs(api, namespace, "first")) == 1
        assert len(jobs(api, namespace, "second")) == 1
    finally:
        op.stop()
        proxy.stop()
