"""The real huggingface_hub client against a local server in the Hub's URL layout
(infertune.testing.hub_server): a fetch lands once in the cache, and a missing repository or
revision, a refused token, a Hub in trouble and a Hub out of reach each say what failed."""

from __future__ import annotations

import json
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from infertune.testing.hub_server import HubServer
from infertune.tuner import hub_fetch
from infertune.tuner.api import ModelSource
from infertune.tuner.fetch_cli import EXIT_PERMANENT, EXIT_TRANSIENT, fetch_model_main
from infertune.tuner.hub_fetch import FETCHED_MARKER, FetchError, fetch
from infertune.tuner.models import CACHE_ENV, hf_local_dir, resolve_model

TOKEN = "hf_test_Secret_0123456789"  # a token the server knows
REPO = "org/tiny"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The served directory: the project's tiny random checkpoint as org/tiny (and org/gated)."""
    from infertune.engine.make_model import ensure_model

    root = tmp_path_factory.mktemp("hub")
    for repo in (REPO, "org/gated"):
        shutil.copytree(ensure_model("tiny"), root / repo)
    return root


@pytest.fixture
def hub(served: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    with HubServer(served, tokens={TOKEN, "hf_other"}, gated={"org/gated": {TOKEN}}) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no token file, no shared cache
        monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
        yield server


def no_sleep(_: float) -> None:
    pass


def test_a_fetch_copies_every_file_of_one_commit_once(hub: HubServer, served: Path) -> None:
    uri = f"hf://{REPO}"
    dest = hf_local_dir(uri)
    got = fetch(uri, dest)
    assert got.commit == hub.commit(REPO) and got.directory == dest
    for src in (served / REPO).iterdir():
        assert (dest / src.name).read_bytes() == src.read_bytes(), src.name
    marker = json.loads((dest / FETCHED_MARKER).read_text())
    assert marker["commit"] == hub.commit(REPO) and marker["files"] == got.files > 0
    before = len(hub.state.requests)
    assert fetch(uri, dest).commit == got.commit
    assert len(hub.state.requests) == before  # fetched once: the second pod touches no network
    # The tuner finds it where the fetch put it, under the same rules.
    assert resolve_model(ModelSource(uri=uri)) == dest
    assert resolve_model(ModelSource(uri=f"hf://{REPO}@main")) == dest


def test_a_pinned_commit_is_its_own_directory(hub: HubServer) -> None:
    commit = hub.commit(REPO)
    got = resolve_model(ModelSource(uri=f"hf://{REPO}", revision=commit))
    assert got.name == commit and (got / "config.json").is_file()


@pytest.mark.parametrize(
    ("uri", "token", "what", "status", "code"),
    [
        ("hf://org/missing", None, "repo", 404, "RepoNotFound"),
        (f"hf://{REPO}@no-such-branch", None, "revision", 404, "RevisionNotFound"),
        ("hf://org/gated", None, "token", 401, "GatedRepo"),
        ("hf://org/gated", "hf_other", "token", 403, "GatedRepo"),
        ("hf://org/gated", "hf_unknown", "token", 401, None),
    ],
)
def test_permanent_failures_say_what_and_the_hubs_answer(
    hub: HubServer,
    monkeypatch: pytest.MonkeyPatch,
    uri: str,
    token: str | None,
    what: str,
    status: int,
    code: str | None,
) -> None:
    if token:
        monkeypatch.setenv("HF_TOKEN", token)
    slept: list[float] = []
    with pytest.raises(FetchError) as err:
        fetch(uri, hf_local_dir(uri), sleep=slept.append)
    e = err.value
    assert (e.what, e.status, e.code, e.permanent) == (what, status, code, True)
    assert f"the Hub answered {status}" in e.message and slept == []  # never retried
    assert token is None or token not in e.message
    assert not (hf_local_dir(uri) / FETCHED_MARKER).exists()


def test_the_gated_repo_with_its_token(hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    got = fetch("hf://org/gated", hf_local_dir("hf://org/gated"))
    assert (got.directory / "config.json").is_file()
    assert all(had_token for _, path, had_token in hub.state.requests if "gated" in path)


def test_a_hub_in_trouble_is_retried_with_bounded_backoff(hub: HubServer) -> None:
    hub.state.fail_next = 2
    slept: list[float] = []
    got = fetch(f"hf://{REPO}", hf_local_dir(f"hf://{REPO}"), sleep=slept.append)
    assert (got.directory / "config.json").is_file() and slept == [2.0, 4.0]
    hub.state.fail_next = 100
    slept.clear()
    with pytest.raises(FetchError) as err:
        fetch(f"hf://{REPO}@{got.commit}", hf_local_dir(f"hf://{REPO}@x"), sleep=slept.append)
    assert (err.value.what, err.value.status, err.value.permanent) == ("hub", 503, False)
    assert slept == [2.0, 4.0, 8.0, 16.0] and "gave up after 5 attempts" in err.value.message


def test_a_hub_out_of_reach_is_a_network_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with pytest.raises(FetchError) as err:
        fetch("hf://org/x", tmp_path / "x", attempts=2, sleep=no_sleep)
    assert (err.value.what, err.value.permanent) == ("network", False)


def test_the_init_step_reports_in_its_termination_message(
    hub: HubServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    term = tmp_path / "termination-log"
    monkeypatch.setenv("HF_TOKEN", "hf_other")
    assert (
        fetch_model_main(["hf://org/gated", "--termination-message", str(term)]) == EXIT_PERMANENT
    )
    out = json.loads(term.read_text())
    assert (out["what"], out["status"], out["code"]) == ("token", 403, "GatedRepo")
    logged = capsys.readouterr()
    assert "hf_other" not in logged.out + logged.err + term.read_text()  # the token never shows
    hub.state.fail_next = 1000
    monkeypatch.setattr(hub_fetch, "BASE_DELAY_S", 0.01)
    assert fetch_model_main([f"hf://{REPO}", "--termination-message", str(term)]) == EXIT_TRANSIENT
    out = json.loads(term.read_text())
    assert (out["what"], out["status"], out["permanent"]) == ("hub", 503, False)
    hub.state.fail_next = 0
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert (
        fetch_model_main([f"hf://{REPO}", "hf://org/gated", "--termination-message", str(term)])
        == 0
    )
    done = json.loads(term.read_text())["fetched"]
    assert [d["uri"] for d in done] == [f"hf://{REPO}", "hf://org/gated"]
    assert done[0]["commit"] == hub.commit(REPO)


def test_two_pods_filling_one_claim_at_once_both_finish(hub: HubServer, tmp_path: Path) -> None:
    import threading

    dest = tmp_path / "claim" / "hf" / "org" / "tiny" / "main"
    results: list[object] = []

    def one() -> None:
        try:
            results.append(fetch(f"hf://{REPO}", dest, sleep=no_sleep).commit)
        except Exception as exc:  # a failure is the finding
            results.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [hub.commit(REPO)] * 2
    assert json.loads((dest / FETCHED_MARKER).read_text())["commit"] == hub.commit(REPO)


def test_an_unwritable_cache_is_a_cache_error(hub: HubServer, tmp_path: Path) -> None:
    (tmp_path / "not-a-dir").write_text("")
    with pytest.raises(FetchError) as err:
        fetch(f"hf://{REPO}", tmp_path / "not-a-dir" / "x", sleep=no_sleep)
    assert (err.value.what, err.value.permanent) == ("cache", True)


def test_other_formats_weights_are_not_fetched_beside_safetensors(
    hub: HubServer, served: Path, tmp_path: Path
) -> None:
    repo = served / "org" / "llama-like"
    shutil.copytree(served / REPO, repo)
    (repo / "original").mkdir()
    (repo / "original" / "consolidated.00.pth").write_bytes(b"\0" * 4096)
    (repo / "pytorch_model.bin").write_bytes(b"\0" * 4096)
    try:
        got = fetch("hf://org/llama-like", tmp_path / "ll", sleep=no_sleep)
    finally:
        shutil.rmtree(repo)
    names = {
        p.relative_to(got.directory).as_posix() for p in got.directory.rglob("*") if p.is_file()
    }
    assert "config.json" in names and any(n.endswith(".safetensors") for n in names)
    assert not {"original/consolidated.00.pth", "pytorch_model.bin"} & names
    assert not [p for _, p, _ in hub.state.requests if p.endswith((".pth", ".bin"))]


def test_a_gguf_model_keeps_every_file() -> None:
    files = ["config.json", "model.safetensors", "model-Q4_0.gguf"]
    assert "*.gguf" in hub_fetch.redundant_weights(files)
    assert hub_fetch.redundant_weights(files, "gguf") == []
    assert hub_fetch.redundant_weights(["pytorch_model.bin", "config.json"]) == []
