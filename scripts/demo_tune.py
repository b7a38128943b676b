"""`make demo-tune`: the tuner alone on the embedded defaults, no cluster (`make demo` runs the whole loop).

Step 1 validates every example and shows the demo manifest with its defaults resolved.
Step 2 runs a real tuning study on the tiny model with the built-in engine on this CPU
(`infertune tune examples/demo.yaml`) and prints the winner, its SLO margins and the report path.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


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
    if run(infertune, "validate", "--show", "examples/demo.yaml") != 0:
        return 1
    step("2/2 Tune: profile the tiny model, search the space, prove the winner")
    out = ROOT / "reports/demo"
    if out.exists():
        # `infertune tune` resumes the study it finds in --out (what a restarted Job must do);
        # the demo is a fresh study each time, and the previous one is kept beside it.
        previous = out.with_name("demo.previous")
        shutil.rmtree(previous, ignore_errors=True)
        out.rename(previous)
        print(f"(the previous run's study and report moved to {previous.relative_to(ROOT)})")
    return run(infertune, "tune", "examples/demo.yaml", "--out", "reports/demo")


if __name__ == "__main__":
    sys.exit(main())
