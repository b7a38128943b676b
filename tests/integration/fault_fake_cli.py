"""operator_fake_cli.py with a gate: `tune` waits until the file INFERTUNE_FAULT_GATE/release
exists, so a fault test decides how long "mid-tuning" lasts (at most 5 minutes)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import operator_fake_cli  # beside this script, which Python puts first on sys.path


def main() -> int:
    gate = os.environ.get("INFERTUNE_FAULT_GATE")
    if sys.argv[1:2] == ["tune"] and gate:
        deadline = time.monotonic() + 300
        while not (Path(gate) / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    return operator_fake_cli.main()


if __name__ == "__main__":
    sys.exit(main())
