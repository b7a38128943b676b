"""Fixtures shared by the engine tests."""

from __future__ import annotations

import pytest

from infertune.engine.kernels import describe, native_kernels


@pytest.fixture(params=["native", "torch"])
def fp32_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both fp32 CPU paths: the native kernels (where they build) and torch's ops without them."""
    if request.param == "torch":
        monkeypatch.setattr("infertune.engine.quant.native_kernels", lambda: None)
        monkeypatch.setattr("infertune.engine.model.native_kernels", lambda: None)
    elif native_kernels() is None:
        pytest.skip(f"no native kernels here: {describe()}")
    return str(request.param)
