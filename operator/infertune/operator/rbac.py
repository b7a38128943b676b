"""The one list of RBAC rules the operator needs, each with the reason. The Helm chart renders its
ClusterRole from `cluster_role()`; the integration tests bind exactly these rules to a
ServiceAccount and run the operator with its token."""

from __future__ import annotations

from typing import Any

from infertune.operator.api import GROUP, PLURAL

# (apiGroups, resources, verbs, why)
RULES: list[tuple[list[str], list[str], list[str], str]] = [
    ([GROUP], [PLURAL], ["get", "list", "watch", "patch"],
     "watch InferenceServices; kopf patches its progress annotations and finalizer"),
    ([GROUP], [f"{PLURAL}/status"], ["get", "patch"],
     "write status (conditions, profile, best/live config, observations) via the status subresource"),
    (["batch"], ["jobs"], ["get", "list", "watch", "create", "delete"],
     "run tuning Jobs, watch them finish, remove superseded runs"),
    ([""], ["configmaps"], ["get", "create", "delete"],
     "hand each tuning run its spec (mounted into the Job's pod)"),
    ([""], ["pods"], ["get", "list", "watch"],
     "read the tuning pod's termination message (the result); find serving pods to scrape and their nodes"),
    ([""], ["nodes"], ["get", "list", "watch"],
     "read nvidia.com/gpu.product of the nodes serving a model (retune on hardware change)"),
    (["apps"], ["deployments"], ["get", "list", "watch", "create", "patch", "delete"],
     "roll out the tuned config (stable and canary Deployments)"),
    ([""], ["services"], ["get", "create", "patch"], "the Service in front of the serving pods"),
    ([""], ["events"], ["create", "patch"], "tell the story in `kubectl describe` (kopf posts core Events)"),
    (["events.k8s.io"], ["events"], ["create", "patch"], "the same through the newer Events API"),
    (["kopf.dev"], ["clusterkopfpeerings", "kopfpeerings"], ["get", "list", "watch", "patch"],
     "kopf peering: two replicas, one active (only with --peering)"),
    (["apiextensions.k8s.io"], ["customresourcedefinitions"], ["list", "watch"],
     "kopf discovers which watched resources exist and follows CRD changes"),
    ([""], ["namespaces"], ["list", "watch"],
     "kopf follows namespaces when watching several or all of them"),
]  # fmt: skip


def policy_rules() -> list[dict[str, Any]]:
    return [{"apiGroups": g, "resources": r, "verbs": v} for g, r, v, _ in RULES]


def cluster_role(name: str = "infertune-operator") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": policy_rules(),
    }


def cluster_role_binding(name: str, service_account: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
    }


def peering_crds() -> list[dict[str, Any]]:
    """kopf's peering resources (needed only with --peering); same schema kopf documents."""
    out = []
    for kind, plural, scope in (
        ("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        ("KopfPeering", "kopfpeerings", "Namespaced"),
    ):
        out.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.kopf.dev"},
                "spec": {
                    "group": "kopf.dev",
                    "scope": scope,
                    "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "properties": {
                                        "status": {
                                            "type": "object",
                                            "x-kubernetes-preserve-unknown-fields": True,
                                        }
                                    },
                                }
                            },
                        }
                    ],
                },
            }
        )
    return out
