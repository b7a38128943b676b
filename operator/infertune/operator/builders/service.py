"""The Service in front of the serving pods (stable and canary tracks share it by replica share)."""

from __future__ import annotations

from infertune.operator.api import InferenceService
from infertune.operator.builders.common import LABEL_COMPONENT, LABEL_ISVC, Obj, metadata, stamp
from infertune.operator.settings import OperatorSettings


def desired_service(isvc: InferenceService, settings: OperatorSettings) -> Obj:
    return stamp(
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata(isvc, isvc.name, "serving"),
            "spec": {
                "type": "ClusterIP",
                "selector": {LABEL_ISVC: isvc.name[:63], LABEL_COMPONENT: "serving"},
                "ports": [
                    {
                        "name": "http",
                        "port": settings.serving_port,
                        "targetPort": "http",
                        "protocol": "TCP",
                    }
                ],
            },
        }
    )
