"""`make demo`: the whole loop on this machine, narrated.

A local Kubernetes control plane with fake GPU nodes (`scripts/devcluster/`), a real Prometheus
scraping the serving pods, the CRD and `infertune operator`; then `examples/demo.yaml` is applied
and the story is told from the cluster's own state: profile -> trials -> winner -> rollout -> live
SLO check under real load (the project's load generator) -> a traffic shift (much longer prompts)
-> the TrafficDrift retune -> the new rollout -> a summary table and the report's path.
Ctrl-C (or SIGTERM) tears everything down. `--cluster existing` uses `$KUBECONFIG` instead.
`make demo-tune` runs the older flow: the tuner alone, no cluster (scripts/demo_tune.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml
from demo_stack import GROUP, INFERTUNE, PLURAL, ROOT, VERSION, Stack, stop_group, wait_until
from kubernetes import client

from infertune.engine.pretrained import ensure_builtin
from infertune.tuner.candidate import Candidate

DEMO = ROOT / "examples" / "demo-smollm2.yaml"  # a real model (examples/demo.yaml: a tiny one)
LABEL = "infertune.dev/inferenceservice"
LONG_PROMPT = 512  # tokens: ~2.6x the demo's tuned 64-320, far beyond the 50% drift threshold
QUESTION = "What is the capital of France?"  # asked of the rolled-out Deployment (real weights)
T0 = time.monotonic()


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:6.0f}s] {msg}", flush=True)


def step(n: int, title: str) -> None:
    print(f"\n=== {n}/8 {title}", flush=True)


class Story:
    """Reads the InferenceService and its children; everything shown comes from the cluster."""

    def __init__(self, stack: Stack, name: str) -> None:
        self.stack, self.name, self.ns = stack, name, stack.namespace
        assert stack.api is not None
        self.custom = client.CustomObjectsApi(stack.api)
        self.core = client.CoreV1Api(stack.api)
        self.batch = client.BatchV1Api(stack.api)
        self.facts: dict[str, Any] = {"runs": []}

    def obj(self) -> dict[str, Any]:
        got: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.ns, PLURAL, self.name
        )
        return got

    def status(self) -> dict[str, Any]:
        return self.obj().get("status") or {}

    def cond(self, kind: str) -> dict[str, Any]:
        return next((c for c in self.status().get("conditions", []) if c["type"] == kind), {})

    def history(self, since: int = 0) -> list[dict[str, Any]]:
        return list(self.status().get("history", []))[since:]

    def pods(self, selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.ns, label_selector=selector).items)

    # ------------------------------------------------------------------ tuning
    def follow_tuning(self, timeout: float) -> dict[str, Any]:
        """Tail the tuning Job's pod (profile, one line per trial) until the run's result is in."""
        done = {r["job"] for r in self.facts["runs"]}
        job = wait_until(
            lambda: (j := (self.status().get("tuning") or {}).get("job")) not in done and j,
            "a new tuning Job", 60,
        )  # fmt: skip
        run = self.status()["tuning"]
        say(f"tuning Job {job} ({run.get('reason')}), study {run.get('study')}")
        pod = wait_until(
            lambda: [p for p in self.pods(f"job-name={job}") if p.spec.node_name],
            "the tuning pod to be scheduled", 120,
        )[0]  # fmt: skip
        say(
            f"pod {pod.metadata.name} scheduled on {pod.spec.node_name} (required GPU product from spec.hardware)"
        )
        shown = 0
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            lines = self.stack.pod_log(pod.metadata.name, "tuner").splitlines()
            for line in lines[shown:]:
                if (
                    line.strip()
                    and not line.startswith((" ", "\t", "USDT:"))
                    and "Warning" not in line
                ):
                    print(f"    tuner | {line[:150]}", flush=True)
            shown = len(lines)
            run = self.status().get("tuning") or {}
            if run.get("job") == job and run.get("finishedAt"):
                break
            time.sleep(2)
        else:
            raise TimeoutError(f"tuning Job {job} did not finish in {timeout:.0f}s")
        record = {"job": job, "pod": pod.metadata.name, "reason": run.get("reason"),
                  "node": pod.spec.node_name, "trials": run.get("trialsCompleted"),
                  "report": self.copy_report(job, pod.metadata.name)}  # fmt: skip
        self.facts["runs"].append(record)
        return record

    def copy_report(self, job: str, pod: str) -> str | None:
        """The tuner writes its report in the pod's emptyDir; keep a copy past the teardown."""
        pod_dir = self.stack.pod_dir(pod)
        if pod_dir is None or not (pod_dir / "volumes" / "out").is_dir():
            return None
        dest = self.stack.out / job
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(pod_dir / "volumes" / "out", dest)
        report = next(iter(sorted(dest.rglob("report.html"))), None)
        if report is None:
            return None
        return str(report.relative_to(ROOT)) if report.is_relative_to(ROOT) else str(report)

    def rolled_out(self, config_hash: str, timeout: float) -> Any:
        def ready() -> Any:
            c = self.cond("RolledOut")
            if c.get("status") != "True" or config_hash not in c.get("message", ""):
                return None
            pods = [p for p in self.pods(f"{LABEL}={self.name},app.kubernetes.io/component=serving")
                    if p.status.pod_ip and p.metadata.deletion_timestamp is None
                    and (p.metadata.annotations or {}).get("infertune.dev/config-hash") == config_hash
                    and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]  # fmt: skip
            return pods[0] if pods else None

        return wait_until(ready, f"rollout of config {config_hash}", timeout)


def describe(config: dict[str, Any]) -> str:
    """A status or summary configuration (camelCase) in the words the operator's messages use."""
    return Candidate.from_wire(config).label()


def model_dir() -> Path:
    """The demo's checkpoint on this machine (builtin://: converted or generated once, cached)."""
    uri = yaml.safe_load(DEMO.read_text())["spec"]["model"]["uri"]
    return ensure_builtin(urlparse(uri).netloc)


def ask(url: str, question: str = QUESTION) -> str:
    """One chat answer from the serving pod (greedy), as a user of the Service would get it."""
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": 48,
            "temperature": 0}  # fmt: skip
    headers = {"Content-Type": "application/json"}
    chat = f"{url}/v1/chat/completions"  # the pod's http:// URL
    req = urllib.request.Request(chat, json.dumps(body).encode(), headers)  # noqa: S310
    with urllib.request.urlopen(req, timeout=120) as r:  # noqa: S310
        return str(json.loads(r.read())["choices"][0]["message"]["content"]).strip()


def load(
    url: str, out: Path, rate: float, duration: str, prompt_tokens: int | None = None
) -> subprocess.Popen[bytes]:
    """Real traffic from the project's load generator (`infertune bench`), in its own process group."""
    argv = [INFERTUNE, "bench", "--url", url, "--profile", str(DEMO), "--rate", f"{rate:g}",
            "--duration", duration, "--quiet", "--json", str(out.with_suffix(".json"))]  # fmt: skip
    # The model's own tokenizer, so that a "1536-token prompt" is 1536 tokens to the engine too
    # (without it the generator sizes prompts in words, not in this vocabulary's tokens).
    argv += ["--tokenizer", str(model_dir())]
    if prompt_tokens is not None:
        argv += ["--prompt-tokens", str(prompt_tokens)]
    with out.open("wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def bench_line(out: Path) -> str:
    """One line from the load generator's JSON result."""
    try:
        r = json.loads(out.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return "(no load generator result)"

    def p95(key: str) -> str:
        v = (r.get(key) or {}).get("p95")
        return f"{v:.0f}ms" if isinstance(v, int | float) else "-"

    good = r.get("goodput")
    met = ", ".join(f"{k} {'met' if v else 'MISSED'}" for k, v in (r.get("slo_met") or {}).items())
    return (f"{r.get('completed', '?')} requests ok, {r.get('failed', 0)} failed; TTFT p95 {p95('ttft')}, "
            f"ITL p95 {p95('itl')}; goodput {good if good is None else round(good, 2)} req/s; {met}")  # fmt: skip


def observed_after(story: Story, since: str) -> dict[str, Any] | None:
    obs = story.status().get("observed") or {}
    return obs if obs.get("time", "") >= since and obs.get("source") else None


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def run_story(stack: Stack, out: Path, budget: float) -> dict[str, Any]:
    spec = yaml.safe_load(DEMO.read_text())
    name = spec["metadata"]["name"]
    step(4, f"Apply {DEMO.relative_to(ROOT)} ({name}: {spec['spec']['model']['uri']}, "
            f"SLO TTFT p95 <= {spec['spec']['slo']['ttft']['max']}, ITL p95 <= {spec['spec']['slo']['itl']['max']})")  # fmt: skip
    stack.kubectl("apply", "-n", stack.namespace, "-f", str(DEMO))
    story = Story(stack, name)
    first = story.follow_tuning(budget)
    st = story.status()
    prof = story.cond("Profiled")
    say(f"profile: {prof.get('message', '(none)')}")
    tuned = story.cond("Tuned")
    say(f"Tuned={tuned.get('status')} ({tuned.get('reason')}): {tuned.get('message')}")
    if not st.get("best"):
        raise RuntimeError(f"the tuner found no configuration: {tuned.get('message')}")
    winner = st["best"]
    story.facts.update(winner=winner, profile=st.get("profile"), tuned_reason=tuned.get("reason"))

    step(5, "Rollout: a Deployment + Service with the winning configuration")
    pod = story.rolled_out(st["live"]["configHash"], 600)
    url = stack.url_for(pod)
    say(
        f"{describe(st['live'])} serving in pod {pod.metadata.name} on {pod.spec.node_name} at {url}"
    )
    story.facts["rollout"] = {"pod": pod.metadata.name, "config": st["live"]["configHash"]}
    answer = ask(url)
    say(f"asked the Service {QUESTION!r}: {answer!r}")
    story.facts["answer"] = {"question": QUESTION, "answer": answer, "config": describe(st["live"])}

    step(6, "Live SLO check: real traffic shaped like the spec's, judged from Prometheus")
    tuned_rate = float(
        (winner.get("measured") or {}).get("requestRate") or spec["spec"]["traffic"]["rate"]
    )
    rate = round(tuned_rate * 0.6, 2)  # within the 50% rate-drift threshold, gentle on 2 cores
    since = now_iso()
    steady = load(url, out / "load-steady.log", rate, "20m")
    prompts = spec["spec"]["traffic"]["promptTokens"]
    tuned_prompts = f"{prompts.get('min')}-{prompts.get('max')}"
    say(f"infertune bench at {rate:g} req/s, prompts {tuned_prompts} tokens (pid {steady.pid})")
    obs = wait_until(lambda: observed_after(story, since), "a live observation", 240, 2)
    slo = story.cond("SLOMet")
    f = obs["figures"]
    say(f"SLOMet={slo.get('status')} ({obs['source']}): {slo.get('message')}; {f.get('requestRate')} req/s, "
        f"prompt {f.get('promptTokensMean') or 0:.0f} tokens mean")  # fmt: skip
    story.facts["live_check"] = {"slo_met": obs["sloMet"], "source": obs["source"], "figures": f}

    step(
        7,
        f"Traffic shift: prompts of {LONG_PROMPT} tokens (tuned for {tuned_prompts}) -> retune",
    )
    seen = len(story.history())
    # About the same prompt tokens per second as before, in fewer, much longer requests: the
    # traffic's shape changed (TrafficDrift) while the SLOs still hold on a busy 2-core machine.
    mean_prompt = (prompts.get("min", 0) + prompts.get("max", 0)) / 2 or prompts.get("mean", 100)
    # (At least 0.2 req/s, so each 30 s violation window still sees several requests.)
    long_rate = max(round(rate * mean_prompt / LONG_PROMPT, 2), 0.2)
    shifted = load(url, out / "load-shifted.log", long_rate, "20m", prompt_tokens=LONG_PROMPT)
    stop_group(
        steady, grace=15
    )  # after the new load started: no gap that would look like a rate change
    say(
        f"infertune bench at {long_rate:g} req/s with {LONG_PROMPT}-token prompts (pid {shifted.pid})"
    )
    last = ""

    def triggered() -> dict[str, Any] | None:
        nonlocal last
        obs = story.status().get("observed") or {}
        msg = f"live: {(obs.get('figures') or {}).get('promptTokensMean') or 0:.0f} prompt tokens mean, SLO met={obs.get('sloMet')}"
        if msg != last:
            say(msg)
            last = msg
        return next((h for h in story.history(seen) if h["event"] == "RetuneTriggered"), None)

    trigger = wait_until(triggered, "a retune", 420, 3)
    say(f"RetuneTriggered ({trigger['reason']}): {trigger['message']}")
    stop_group(
        shifted, grace=15
    )  # the retune measures on its own; the load would only slow it down here
    story.facts["retune"] = {"reason": trigger["reason"], "message": trigger["message"]}
    second = story.follow_tuning(budget)
    decision = wait_until(
        lambda: next((h for h in story.history(seen) if h["event"] in ("RetuneAccepted", "RetuneKept", "TuningFailed")), None),
        "the retune's verdict", 120, 2,
    )  # fmt: skip
    st = story.status()
    say(f"{decision['event']}: {decision['message']}")
    story.facts["retune"].update(verdict=decision["event"], best=st.get("best"))

    step(8, "New rollout and a live check on the shifted traffic")
    if decision["event"] == "RetuneAccepted":
        pod = story.rolled_out(st["live"]["configHash"], 600)
        url = stack.url_for(pod)
        say(f"{describe(st['live'])} now serving in pod {pod.metadata.name} at {url}")
        story.facts["new_rollout"] = {"pod": pod.metadata.name, "config": st["live"]["configHash"]}
    else:
        say("the live configuration stays (the retune did not beat it)")
    check = load(url, out / "load-after.log", long_rate, "30s", prompt_tokens=LONG_PROMPT)
    check.wait(180)
    say("infertune bench: " + bench_line(out / "load-after.log"))
    story.facts["after"] = bench_line(out / "load-after.log")
    story.facts["history"] = story.history()
    story.facts["first"], story.facts["second"] = first, second
    return story.facts


def summary(facts: dict[str, Any]) -> None:
    print("\n=== Summary", flush=True)
    rows = [("stage", "what", "figures")]
    w = facts["winner"]
    m = w.get("measured") or {}
    rows.append(
        (
            "tune",
            describe(w),
            f"TTFT p95 {m.get('ttftP95Ms') or 0:.0f}ms, goodput {m.get('goodputRps') or 0:.2f} req/s",
        )
    )
    lc = facts["live_check"]
    rows.append(("live check", f"SLO met={lc['slo_met']} ({lc['source']})",
                 f"TTFT p95 {lc['figures'].get('ttftP95Ms') or 0:.0f}ms, ITL p95 {lc['figures'].get('itlP95Ms') or 0:.1f}ms"))  # fmt: skip
    rt = facts["retune"]
    best = rt.get("best") or {}
    bm = best.get("measured") or {}
    rows.append((f"retune ({rt['reason']})", describe(best) if best else "-",
                 f"{rt['verdict']}; TTFT p95 {bm.get('ttftP95Ms') or 0:.0f}ms, goodput {bm.get('goodputRps') or 0:.2f} req/s"))  # fmt: skip
    rows.append(
        ("after", facts.get("new_rollout", {}).get("pod", "(unchanged)"), facts.get("after", ""))
    )
    widths = [max(len(str(r[i])) for r in rows) for i in range(2)]
    for r in rows:
        print(f"  {r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}")
    if facts.get("answer"):
        a = facts["answer"]
        print(f"\n  {a['config']} answered {a['question']!r}: {a['answer']!r}")
    print("\n  history:")
    for h in facts.get("history", []):
        print(f"    {h['time']} {h['event']:<15} {h['reason']:<13} {h.get('message', '')[:110]}")
    for run in facts["runs"]:
        print(f"  report ({run['reason']}): {run['report'] or '(in the tuning pod)'}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cluster", choices=("local", "existing"), default="local",
                   help="local: start the dev control plane here; existing: use $KUBECONFIG")  # fmt: skip
    p.add_argument("--namespace", default="infertune-demo")
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "demo-cluster")
    p.add_argument("--tune-timeout", type=float, default=1500, help="seconds per tuning run")
    p.add_argument("--record", type=Path, help="write what happened as JSON (for the test)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    # SIGTERM tears down like Ctrl-C (the `finally` below).
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # And Ctrl-C tears down even when the demo was started with SIGINT ignored (a background job
    # of a non-interactive shell, a CI runner, `make test` under one): Python keeps an inherited
    # SIG_IGN, and the demo then ran on past the interrupt with everything it had started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stack = Stack(args.namespace, args.out, existing=args.cluster == "existing", say=say)
    facts: dict[str, Any] = {}
    code = 1
    try:
        step(
            1,
            "Control plane"
            + (
                " (existing cluster)"
                if stack.existing
                else ": etcd, kube-apiserver, controller-manager, fake GPU nodes"
            ),
        )
        stack.start_cluster()
        if stack.cluster is not None:
            facts["state_dir"] = str(stack.cluster.state_dir)
        step(2, "Prometheus")
        url = stack.start_prometheus()
        step(3, "The InferenceService CRD and the operator")
        stack.start_operator(url)
        facts.update(run_story(stack, args.out, args.tune_timeout))
        summary(facts)
        code = 0
    except KeyboardInterrupt:
        print("\ninterrupted: tearing down", flush=True)
        code = 130
    except Exception as exc:
        print(f"\ndemo failed: {exc}\noperator log: {args.out / 'operator.log'}", flush=True)
    finally:
        facts["pids"] = stack.pids
        signal.signal(
            signal.SIGINT, signal.SIG_IGN
        )  # a second Ctrl-C must not cut the teardown short
        stack.close()
        say(
            f"teardown done: {len(stack.pids)} processes stopped"
            + ("" if stack.existing else ", cluster state removed")
        )
        facts["wall_s"] = round(time.monotonic() - T0, 1)
        if args.record:
            args.record.write_text(json.dumps(facts, indent=1, default=str))
    return code


if __name__ == "__main__":
    sys.exit(main())
