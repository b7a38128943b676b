"""tests/conftest.py keeps the `slow` marker and the tests/slow/ folder in agreement."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--rootdir", str(root),
         "-c", str(root / "pytest.ini"), "--collect-only", "-q", *args, str(root / "tests")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def _suite(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow\n    cluster\n")
    (tmp_path / "tests").mkdir()
    shutil.copy(TESTS / "conftest.py", tmp_path / "tests" / "conftest.py")
    for name, text in files.items():
        path = tmp_path / "tests" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_everything_under_tests_slow_is_slow_even_unmarked(tmp_path: Path) -> None:
    root = _suite(
        tmp_path,
        {
            "slow/test_long.py": "def test_unmarked():\n    pass\n",
            "unit/test_quick.py": "def test_quick():\n    pass\n",
        },
    )
    fast = _pytest(root, "-m", "not slow")
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert "test_quick" in fast.stdout and "test_unmarked" not in fast.stdout
    slow = _pytest(root, "-m", "slow")
    assert "test_unmarked" in slow.stdout and "test_quick" not in slow.stdout


def test_slow_outside_tests_slow_fails_unless_it_is_a_cluster_suite(tmp_path: Path) -> None:
    marked = "import pytest\n\n@pytest.mark.slow{}\ndef test_{}():\n    pass\n"
    root = _suite(
        tmp_path,
        {
            "integration/test_cluster_long.py": marked.format(
                "\n@pytest.mark.cluster", "cluster_long"
            ),
            "unit/test_stray.py": marked.format("", "stray"),
        },
    )
    result = _pytest(root)
    assert result.returncode != 0
    assert "marked slow outside tests/slow/" in result.stderr
    assert "test_stray" in result.stderr and "cluster_long" not in result.stderr


def test_this_suite_keeps_the_rule() -> None:
    """Every module in tests/slow/ is collected as slow (none would run under `-m "not slow"`)."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         "-m", "not slow", str(TESTS / "slow")],
        capture_output=True, text=True, timeout=300, check=False, cwd=TESTS.parent,
    )  # fmt: skip
    assert result.returncode == 5, result.stdout + result.stderr  # 5: no tests collected
