"""`make bench`: run every benchmarks/bench_*.py module and print one table.

Each module exposes `run() -> list[dict]` with rows {name, value, unit, note}. Ratios are measured side
by side inside one module run, because this machine is shared and absolute times drift between runs.
Select modules with `make bench ONLY=engine,loadgen`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def main() -> int:
    only = {s.strip() for s in os.environ.get("ONLY", "").split(",") if s.strip()}
    modules = sorted(HERE.glob("bench_*.py"))
    if only:
        modules = [m for m in modules if m.stem.removeprefix("bench_") in only]
    rows: list[dict[str, Any]] = []
    failed = 0
    for path in modules:
        group = path.stem.removeprefix("bench_")
        print(f"== {group} ...", flush=True)
        start = time.monotonic()
        try:
            for row in _load(path).run():
                rows.append({"group": group, **row})
        except Exception:  # a failing benchmark is reported, and the others still run
            failed += 1
            traceback.print_exc()
            rows.append(
                {
                    "group": group,
                    "name": "FAILED",
                    "value": "-",
                    "unit": "",
                    "note": "see traceback",
                }
            )
        print(f"   done in {time.monotonic() - start:.0f}s", flush=True)
    width = max((len(f"{r['group']}: {r['name']}") for r in rows), default=10)
    print()
    print(f"{'benchmark':<{width}}  {'value':>12}  {'unit':<10}  note")
    print("-" * (width + 40))
    for r in rows:
        label = f"{r['group']}: {r['name']}"
        print(
            f"{label:<{width}}  {_fmt(r['value']):>12}  {r.get('unit', ''):<10}  {r.get('note', '')}"
        )
    out = Path(os.environ.get("BENCH_JSON", "reports/bench.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=2, default=str))
    print(f"\nwrote {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
