"""The default render is pinned: any change to what `helm install` creates shows up in review.

Update after a deliberate change:

    INFERTUNE_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/unit/chart/test_chart_snapshot.py
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from chartlib import template_text

SNAPSHOT = Path(__file__).parent / "snapshots" / "default.yaml"


def test_default_render_matches_snapshot(tmp_path: Path) -> None:
    # CRDs have their own drift test (tests/unit/api/test_crd.py); the snapshot covers templates.
    rendered = template_text(tmp=tmp_path, include_crds=False)
    if os.environ.get("INFERTUNE_UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(rendered)
    assert SNAPSHOT.exists(), (
        f"no snapshot yet: run with INFERTUNE_UPDATE_SNAPSHOTS=1 to write {SNAPSHOT}"
    )
    expected = SNAPSHOT.read_text()
    if rendered != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                rendered.splitlines(keepends=True),
                "snapshot",
                "rendered",
            )
        )
        raise AssertionError(
            "the default render changed; if deliberate, rerun with INFERTUNE_UPDATE_SNAPSHOTS=1\n"
            + diff
        )
