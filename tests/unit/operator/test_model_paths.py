"""The operator mounts a model where the tuner, given the same URI, looks for it."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

import pytest

from infertune.operator.builders import common
from infertune.operator.builders.common import model_location
from infertune.tuner import hub_fetch, models
from infertune.tuner.api import ModelSource, TuningSpec
from infertune.tuner.models import MODELS_ROOT, resolve_model


def _mounted(path: str, mounts: list[dict[str, object]]) -> bool:
    return any(PurePosixPath(path).is_relative_to(str(m["mountPath"])) for m in mounts)


@pytest.mark.parametrize("sub", ["", "/llama", "/org/llama-3/8b", "/org/llama/"])
def test_a_pvc_model_is_resolved_where_the_operator_mounts_it(
    sub: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "MODELS_ROOT", str(tmp_path / "mnt" / "models"))
    uri = f"pvc://weights{sub}"
    path, vols, mounts = model_location(uri)
    assert vols[0]["persistentVolumeClaim"]["claimName"] == "weights"
    assert _mounted(path, mounts)
    Path(path).mkdir(parents=True, exist_ok=True)  # what the claim holds once mounted
    assert resolve_model(ModelSource(uri=uri)) == Path(path)


def test_the_mount_point_is_one_constant() -> None:
    path, _, mounts = model_location("pvc://weights/org/llama")
    assert MODELS_ROOT == "/mnt/models"
    assert path == "/mnt/models/weights/org/llama"
    assert mounts[0]["mountPath"] == "/mnt/models/weights"
    # Unmounted here: the tuner names the operator's path in its error.
    with pytest.raises(
        ValueError, match="expected the claim mounted at /mnt/models/weights/org/llama"
    ):
        resolve_model(ModelSource(uri="pvc://weights/org/llama"))
    assert not hasattr(common, "MODELS_ROOT")  # no second copy on the operator's side


@pytest.mark.parametrize("form", ["file://{}", "{}"])
def test_a_file_model_is_resolved_where_the_operator_mounts_it(form: str, tmp_path: Path) -> None:
    model = tmp_path / "org" / "llama"
    model.mkdir(parents=True)
    uri = form.format(model)
    path, vols, mounts = model_location(uri)
    assert vols[0]["hostPath"]["path"] == str(model)
    assert _mounted(path, mounts)
    assert resolve_model(ModelSource(uri=uri)) == Path(path) == model


def test_the_tuning_pod_gets_the_mounted_path_the_tuner_would_resolve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from infertune.operator.builders.job import pod_tuning_spec

    monkeypatch.setattr(models, "MODELS_ROOT", str(tmp_path))
    (tmp_path / "weights" / "llama").mkdir(parents=True)
    spec = TuningSpec.model_validate(
        {"model": {"uri": "pvc://weights/llama"}, "slo": {"ttft": {"max": "500ms"}}}
    )
    in_pod = pod_tuning_spec(spec).model
    assert in_pod.scheme == "file"
    assert resolve_model(in_pod) == resolve_model(spec.model) == tmp_path / "weights" / "llama"


def test_no_volume_for_builtin_models() -> None:
    uri = "builtin://tiny"
    assert model_location(uri) == (uri, [], [])
    assert models.pod_path(uri) is None


@pytest.mark.parametrize(
    ("uri", "path"),
    [
        ("hf://org/llama", "/mnt/model-cache/hf/org/llama/main"),
        ("hf://org/llama@v1.0", "/mnt/model-cache/hf/org/llama/v1.0"),
        ("hf://gpt2@refs/pr/3", "/mnt/model-cache/hf/gpt2/refs%2Fpr%2F3"),
    ],
)
def test_an_hf_model_is_on_the_cache_volume_where_the_tuner_looks(
    uri: str, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's path (model_location) is the tuner's (hf_local_dir) under the mount point,
    which the pods tell the tuner in $INFERTUNE_MODEL_CACHE; no per-URI volume (model_cache)."""
    assert model_location(uri) == (path, [], [])
    monkeypatch.setenv(models.CACHE_ENV, models.MODEL_CACHE_ROOT)
    assert str(models.hf_local_dir(uri)) == path
    # A fetched directory there is what resolve_model returns, no network involved.
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    local = models.hf_local_dir(uri)
    local.mkdir(parents=True)
    (local / hub_fetch.FETCHED_MARKER).write_text("{}")
    assert resolve_model(ModelSource(uri=uri)) == local
    assert str(local).removeprefix(str(tmp_path)) == path.removeprefix(models.MODEL_CACHE_ROOT)
