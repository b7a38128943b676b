"""SGLang's adapter: availability asked of SGLang's own interpreter (never the tuner's), the serving
argv with --enable-metrics, and a chunked-prefill size that is not a multiple of the page size
refused before any server starts (sglang 0.5.23 asserts it in arg_groups/validation_hook.py)."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from infertune.tuner.candidate import Candidate
from infertune.tuner.engines import AdapterError
from infertune.tuner.engines.interpreter import has_module
from infertune.tuner.engines.sglang import PYTHON_ENV, VENV_ENV, SglangAdapter


def _interpreter_with_sglang(root: Path) -> Path:
    """An interpreter (a wrapper around this one) whose path finds a package named sglang."""
    (root / "site" / "sglang").mkdir(parents=True)
    (root / "site" / "sglang" / "__init__.py").write_text("")
    python = root / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nPYTHONPATH={root / "site"} exec {sys.executable} "$@"\n')
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return python


def test_sglang_is_found_in_its_own_interpreter_not_the_tuners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python = _interpreter_with_sglang(tmp_path)
    monkeypatch.delenv(PYTHON_ENV, raising=False)
    monkeypatch.setenv(VENV_ENV, str(python.parent.parent))
    adapter = SglangAdapter()
    assert adapter.missing() is None
    assert adapter.program() == [str(python), "-m", "sglang.launch_server"]
    monkeypatch.setenv(PYTHON_ENV, str(python))  # the explicit interpreter wins over the venv
    assert SglangAdapter().program()[0] == str(python)


def test_a_missing_sglang_says_which_interpreter_and_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(PYTHON_ENV, sys.executable)  # the tuner's own: no sglang here
    why = SglangAdapter().missing()
    assert why is not None and sys.executable in why and PYTHON_ENV in why
    monkeypatch.setenv(PYTHON_ENV, str(tmp_path / "nowhere" / "python"))
    assert SglangAdapter().missing() is not None
    assert not has_module(str(tmp_path / "nowhere" / "python"), "sglang")


def test_serving_argv_exports_metrics() -> None:
    argv = SglangAdapter().flags(Candidate("sglang", "bf16", 16, 1024, 32, False), "/m", "h", 1)
    assert "--enable-metrics" in argv


@pytest.mark.parametrize(
    ("chunk", "page", "ok"), [(1024, 32, True), (1000, 32, False), (96, 64, False)]
)
def test_chunk_size_must_be_a_multiple_of_the_page_size(chunk: int, page: int, ok: bool) -> None:
    config = Candidate("sglang", "bf16", 16, chunk, page, False)
    if ok:
        SglangAdapter().validate(config)
        return
    with pytest.raises(AdapterError, match="multiple of the page size"):
        SglangAdapter().flags(config, "/m", "h", 1)
