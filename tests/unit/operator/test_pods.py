"""What the operator keeps of a pod: enough to find the result and the pods to scrape."""

from __future__ import annotations

from infertune.operator.pods import pod_summary


def test_terminated_tuning_pod_yields_its_message() -> None:
    pod = {
        "metadata": {"name": "x-tune-1-abcde", "uid": "u", "labels": {"job-name": "x-tune-1", "app.kubernetes.io/component": "tuning"}},
        "spec": {"nodeName": "gpu-h100-0"},
        "status": {"phase": "Succeeded", "containerStatuses": [
            {"state": {"terminated": {"exitCode": 0, "message": '{"version": 1}', "finishedAt": "2026-01-01T00:00:00Z"}}}
        ]},
    }  # fmt: skip
    s = pod_summary(pod)
    assert (s["job"], s["node"], s["component"], s["terminated"]) == (
        "x-tune-1",
        "gpu-h100-0",
        "tuning",
        True,
    )
    assert s["message"] == '{"version": 1}'


def test_serving_pod_readiness_and_track() -> None:
    pod = {
        "metadata": {"name": "x-7d-abc", "uid": "u2", "labels": {"app.kubernetes.io/component": "serving", "infertune.dev/track": "canary"}},
        "spec": {"nodeName": "n"},
        "status": {"podIP": "127.0.1.5", "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    s = pod_summary(pod)
    assert (
        s["ready"] is True
        and s["ip"] == "127.0.1.5"
        and s["track"] == "canary"
        and "terminated" not in s
    )


def test_oom_killed_serving_pod_is_noted_after_its_restart() -> None:
    # The kubelet restarted the container: the kill is in lastState, the pod waits in back-off.
    pod = {
        "metadata": {"name": "x-7d-abc", "uid": "u3", "labels": {"app.kubernetes.io/component": "serving"}},
        "spec": {"nodeName": "n"},
        "status": {"containerStatuses": [{
            "name": "engine", "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137, "finishedAt": "t"}},
        }]},
    }  # fmt: skip
    s = pod_summary(pod)
    assert s["oom_killed"] == {"container": "engine", "restarts": 2, "at": "t"}
    assert "terminated" not in s


def test_container_that_exits_normally_is_not_oom_killed() -> None:
    pod = {
        "metadata": {"name": "x", "uid": "u4", "labels": {}},
        "spec": {},
        "status": {"containerStatuses": [{"name": "engine", "lastState": {"terminated": {"reason": "Error", "exitCode": 1}}}]},
    }  # fmt: skip
    assert "oom_killed" not in pod_summary(pod)
