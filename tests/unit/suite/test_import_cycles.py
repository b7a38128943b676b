"""scripts/check_import_cycles.py fails on a package with an import cycle and passes without."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "check_import_cycles.py"


def _package(root: Path, modules: dict[str, str]) -> None:
    pkg = root / "cyclepkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    for name, text in modules.items():
        (pkg / f"{name.replace('.', '/')}.py").write_text(text)


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "cyclepkg"],
        capture_output=True, text=True, env=env, cwd=root, timeout=120, check=False,
    )  # fmt: skip


ACYCLIC = {
    "a": "from cyclepkg import b\n",
    "b": "import cyclepkg.sub.c\n",
    "sub.c": (
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n    from cyclepkg import a  # never runs: no cycle\n\n"
        "def f():\n    import cyclepkg.sub.c  # itself: no cycle\n"
    ),
    "d": "from cyclepkg import a\n",
}


def test_a_package_without_cycles_passes(tmp_path: Path) -> None:
    _package(tmp_path, ACYCLIC)
    result = _check(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No import cycles in cyclepkg" in result.stdout
    assert not list(tmp_path.glob(".*cache*"))  # leaves no grimp cache behind


def test_every_cycle_is_reported_with_a_path(tmp_path: Path) -> None:
    modules = {
        **ACYCLIC,
        # a -> b -> sub.c -> a, closed by a lazy import (it still ties the modules together)
        "sub.c": "def f():\n    from cyclepkg import a\n",
        # and a second, separate cycle
        "e": "import cyclepkg.f\n",
        "f": "from cyclepkg import e\n",
    }
    _package(tmp_path, modules)
    result = _check(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "2 import cycle(s) in cyclepkg" in result.stdout
    assert "cyclepkg.a -> cyclepkg.b -> cyclepkg.sub.c -> cyclepkg.a" in result.stdout
    assert "cyclepkg.e -> cyclepkg.f -> cyclepkg.e" in result.stdout
    assert "cyclepkg.d" not in result.stdout  # imports into a cycle, but is not in one


def test_an_unknown_package_is_a_usage_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "no_such_package_here"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
