"""`make demo-tune`: the tuner alone on the embedded defaults, no cluster (`make demo` runs the whole loop).

Step 1 validates every example and shows the demo manifest with its defaults resolved.
Step 2 runs a real tuning study on SmolLM2-135M-Instruct with the built-in engine on this CPU
(`infertune tune examples/demo-smollm2.yaml`), prints the winner, its SLO margins and the report
path, then serves the winning configuration for a moment and prints its answer to one question.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import get_adapter

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SPEC = "examples/demo-smollm2.yaml"  # `make demo`'s too (scripts/demo.py)
QUESTION = "What is the capital of France?"


def step(title: str) -> None:
    print(f"\n=== {title}", flush=True)


def run(*argv: str) -> int:
    print("$ " + " ".join(argv), flush=True)
    return subprocess.call(list(argv), cwd=ROOT)


def main() -> int:
    infertune = (
        str(BIN / "infertune") if (BIN / "infertune").exists() else shutil.which("infertune")
    )
    if infertune is None:
        print("infertune is not installed; run `make venv`", file=sys.stderr)
        return 2
    step("1/2 Validate the examples (every error would be listed)")
    examples = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "examples").glob("*.yaml"))
    if run(infertune, "validate", *examples) != 0:
        return 1
    step("The demo manifest, defaults resolved")
    if run(infertune, "validate", "--show", SPEC) != 0:
        return 1
    step("2/2 Tune: profile SmolLM2-135M-Instruct, search the space, prove the winner")
    out = ROOT / "reports/demo"
    if out.exists():
        # `infertune tune` resumes the study it finds in --out (what a restarted Job must do);
        # the demo is a fresh study each time, and the previous one is kept beside it.
        previous = out.with_name("demo.previous")
        shutil.rmtree(previous, ignore_errors=True)
        out.rename(previous)
        print(f"(the previous run's study and report moved to {previous.relative_to(ROOT)})")
    code = run(infertune, "tune", SPEC, "--out", "reports/demo")
    if code == 0:
        ask_winner(infertune, out / "result.json")
    return code


def ask_winner(infertune: str, result_file: Path) -> None:
    """Serve the study's best configuration (the closest one when none met the SLOs) with the
    engine's own flags for it, and print its answer to one question: real text from real weights."""
    best = json.loads(result_file.read_text()).get("best")
    if not best:
        return
    config = Candidate.from_dict(best["config"])
    uri = yaml.safe_load((ROOT / SPEC).read_text())["spec"]["model"]["uri"]
    argv = get_adapter(config.engine).flags(config, uri, "127.0.0.1", 0)
    step(f"Ask the winner ({config.label()}): {QUESTION}")
    print("$ infertune " + " ".join(argv), flush=True)
    proc = subprocess.Popen([infertune, *argv], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # "infertune engine ready on http://HOST:PORT"
        if "ready on" not in line:
            print(f"the engine did not start (exit {proc.wait()})", flush=True)
            return
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 48,
                "temperature": 0}  # fmt: skip
        url = line.strip().rsplit(" ", 1)[1] + "/v1/chat/completions"  # the engine's http:// URL
        headers = {"Content-Type": "application/json"}
        req = urllib.request.Request(url, json.dumps(body).encode(), headers)  # noqa: S310
        with urllib.request.urlopen(req, timeout=300) as r:  # noqa: S310
            answer = json.loads(r.read())["choices"][0]["message"]["content"]
        print(f"answer: {answer.strip()!r}", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
