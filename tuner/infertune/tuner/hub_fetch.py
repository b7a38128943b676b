"""Fetch an hf:// model into the model cache with the Hub's own client, once.

`fetch` is what the pods' `infertune fetch-model` init step runs (fetch_cli.py) and what the
tuner's resolve_model runs standalone: `huggingface_hub.snapshot_download` into a plain directory
(models.hf_local_dir: one per repository and revision), the revision resolved to its commit first
so every file comes from that one commit. A marker written last (FETCHED_MARKER) says the
directory is complete; a second fetch of the same URI, a pod on the same cache volume, finds it and
touches no network.

Errors come back as one FetchError that says what was wrong (the repository, the revision, the
token, the network, the disk) and the Hub's answer (status code, reason, X-Error-Code): a missing
repository or revision and a refused token are permanent (no retry can fix them), a network error,
a 429 or a 5xx is retried here with bounded exponential backoff, then reported as transient.

The token comes from $HF_TOKEN (the operator fills it from the Secret the spec names) and is never
printed: messages carry the Hub's answer and the URL, never request headers. $HF_ENDPOINT points
the client at a mirror (or a test server) instead of the Hub.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infertune.tuner.api.model import DEFAULT_REVISION, split_hf_uri

log = logging.getLogger("infertune.tuner.hub_fetch")

FETCHED_MARKER = ".infertune-fetched.json"  # written last by a finished fetch


def fetched(directory: Path) -> bool:
    """True once a fetch into `directory` finished (its marker is written last)."""
    return (directory / FETCHED_MARKER).is_file()


def hf_location(uri: str) -> tuple[str, str]:
    """hf://REPO[@REV] -> (REPO, REV), REV main when the URI pins none."""
    repo, revision = split_hf_uri(uri)
    return repo, revision or DEFAULT_REVISION


# HTTP answers a retry may cure (rate limit, server trouble); every other 4xx is final.
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
ATTEMPTS = 5
BASE_DELAY_S = 2.0
MAX_DELAY_S = 30.0


@dataclass(frozen=True)
class Fetched:
    """A complete local copy of one repository at one commit."""

    uri: str
    repo: str
    revision: str
    commit: str
    directory: Path
    files: int
    bytes: int


class FetchError(Exception):
    """Why a fetch failed. `what`: repo | revision | token | network | hub | disk (full) |
    cache (not writable)."""

    def __init__(
        self,
        what: str,
        message: str,
        *,
        uri: str = "",
        status: int | None = None,
        reason: str | None = None,
        code: str | None = None,
        permanent: bool = True,
    ) -> None:
        super().__init__(message)
        self.what, self.message, self.uri = what, message, uri
        self.status, self.reason, self.code, self.permanent = status, reason, code, permanent

    def answer(self) -> str:
        """The Hub's answer in words: '404 Not Found (RepoNotFound)'."""
        if self.status is None:
            return "no HTTP answer"
        code = f" ({self.code})" if self.code else ""
        return f"{self.status} {self.reason or ''}".strip() + code

    def to_json(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "what": self.what,
            "status": self.status,
            "reason": self.reason,
            "code": self.code,
            "permanent": self.permanent,
            "message": self.message,
        }


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [exc]
    while pending:
        cur = pending.pop(0)
        if cur is None or any(cur is s for s in seen):
            continue
        seen.append(cur)
        pending += [cur.__cause__, cur.__context__]
    return seen


def _http_failure(err: Any, uri: str, *, token_given: bool) -> FetchError:
    """An HfHubHTTPError (it has the response) as a FetchError: what to fix, the Hub's answer."""
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = hf_location(uri)
    resp = err.response
    status = int(resp.status_code)
    reason = str(getattr(resp, "reason_phrase", "") or "")
    code = resp.headers.get("X-Error-Code")
    hub_says = resp.headers.get("X-Error-Message") or ""
    detail = f": {hub_says}" if hub_says else ""
    answer = f"the Hub answered {status} {reason}".rstrip() + (
        f" ({code}{detail})" if code else detail
    )

    def fail(what: str, message: str, permanent: bool = True) -> FetchError:
        return FetchError(
            what, message, uri=uri, status=status, reason=reason, code=code, permanent=permanent
        )

    if isinstance(err, RevisionNotFoundError):
        return fail("revision", f"revision {revision!r} of {repo} not found: {answer}")
    refused = status == 403 or (
        status == 401 and (token_given or "credentials" in hub_says.lower())
    )
    if isinstance(err, GatedRepoError) or refused:
        no_token = "" if token_given else "; no token was given"
        return fail("token", f"{repo} refused the token (gated or private){no_token}: {answer}")
    if isinstance(err, RepositoryNotFoundError) or status in (401, 404):
        hint = "" if token_given else " (a private or gated repository needs a token)"
        return fail("repo", f"repository {repo} not found{hint}: {answer}")
    return fail("hub", f"fetching {repo}@{revision}: {answer}", status not in TRANSIENT_STATUS)


def classify(exc: BaseException, uri: str, *, token_given: bool) -> FetchError:
    """The client's exception as a FetchError. huggingface_hub wraps an API error in a
    LocalEntryNotFoundError when it cannot fall back to a cache, so the whole chain is read."""
    from huggingface_hub.errors import HfHubHTTPError

    repo, revision = hf_location(uri)
    for err in _chain(exc):
        if isinstance(err, HfHubHTTPError) and err.response is not None:
            return _http_failure(err, uri, token_given=token_given)
    for err in _chain(exc):
        if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
            return FetchError("disk", f"the model cache is full: {err}", uri=uri)
        if isinstance(err, OSError) and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return FetchError("cache", f"cannot write the model cache: {err}", uri=uri)
        # The client's transport errors (connection refused, DNS, timeouts) come from its HTTP
        # library (httpx2, httpx or requests by version): matched by module, not by import.
        module = type(err).__module__
        if isinstance(err, ConnectionError | TimeoutError) or module.startswith(
            ("httpx", "requests", "urllib3")
        ):
            return FetchError(
                "network",
                f"cannot reach the Hub for {repo}@{revision}: {type(err).__name__}: {err}",
                uri=uri,
                permanent=False,
            )
    return FetchError(
        "hub", f"fetching {repo}@{revision}: {type(exc).__name__}: {exc}", uri=uri, permanent=False
    )


def _token() -> str | None:
    return os.environ.get("HF_TOKEN") or None


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


# The same weights in other formats, beside safetensors in many repositories (Llama's original/
# consolidated checkpoint, pytorch_model*.bin, TF/Flax/ONNX exports): no engine here loads them
# when safetensors are there, and they can double the download.
OTHER_WEIGHTS = (
    "original/*", "*.pth", "*.pt", "*.bin", "*.h5", "*.msgpack", "*.ot", "*.onnx", "*.onnx_data",
    "*.gguf",
)  # fmt: skip


def redundant_weights(files: list[str], fmt: str = "safetensors") -> list[str]:
    """Patterns of files not to fetch: other formats' weights when the model is read as
    safetensors and the repository has them (a repository without them, or a model.format gguf,
    is fetched whole: its .bin or .gguf files are the model)."""
    wanted = fmt == "safetensors" and any(f.endswith(".safetensors") for f in files)
    return list(OTHER_WEIGHTS) if wanted else []


def _download(uri: str, dest: Path, token: str | None, endpoint: str | None, fmt: str) -> str:
    """One attempt: resolve the revision to its commit, then the files of that commit an engine
    loads (redundant_weights)."""
    from huggingface_hub import HfApi, snapshot_download

    repo, revision = hf_location(uri)
    info = HfApi(endpoint=endpoint, token=token).model_info(repo, revision=revision)
    commit = str(info.sha or revision)
    skip = redundant_weights([s.rfilename for s in info.siblings or []], fmt)
    snapshot_download(
        repo,
        revision=commit,
        local_dir=dest,
        token=token,
        endpoint=endpoint,
        max_workers=4,
        ignore_patterns=skip or None,
    )
    return commit


def read_marker(directory: Path) -> dict[str, Any]:
    try:
        data = json.loads((directory / FETCHED_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _tally(directory: Path) -> tuple[int, int]:
    files = [
        p
        for p in directory.rglob("*")
        if p.is_file() and ".cache" not in p.relative_to(directory).parts
    ]
    return len(files), sum(p.stat().st_size for p in files)


def fetch(
    uri: str,
    dest: Path,
    *,
    attempts: int | None = None,
    base_delay_s: float | None = None,
    max_delay_s: float | None = None,
    sleep: Callable[[float], None] = time.sleep,
    fmt: str = "safetensors",
) -> Fetched:
    """`uri`'s files in `dest`, fetched unless a finished fetch is there already. A transient
    failure is retried `attempts` times in all (default ATTEMPTS), waiting base_delay_s doubled
    each time up to max_delay_s (defaults: the module's, read at call time). `fmt`: the
    model.format the checkpoint is read as (redundant_weights)."""
    attempts = ATTEMPTS if attempts is None else attempts
    base_delay_s = BASE_DELAY_S if base_delay_s is None else base_delay_s
    max_delay_s = MAX_DELAY_S if max_delay_s is None else max_delay_s
    repo, revision = hf_location(uri)
    if fetched(dest):
        m = read_marker(dest)
        return Fetched(
            uri,
            repo,
            revision,
            str(m.get("commit", "")),
            dest,
            m.get("files", 0),
            m.get("bytes", 0),
        )
    token, endpoint = _token(), _endpoint()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FetchError(
            "cache", f"cannot write the model cache at {dest}: {exc}", uri=uri
        ) from exc
    for attempt in range(1, attempts + 1):
        try:
            commit = _download(uri, dest, token, endpoint, fmt)
            break
        except Exception as exc:  # every client error is classified below
            err = classify(exc, uri, token_given=token is not None)
            if err.permanent or attempt == attempts:
                if not err.permanent:
                    err.message += f" (gave up after {attempts} attempts)"
                raise err from exc
            delay = min(max_delay_s, base_delay_s * 2 ** (attempt - 1))
            log.warning(
                "fetch %s: %s; attempt %d of %d in %.0fs",
                uri,
                err.message,
                attempt + 1,
                attempts,
                delay,
            )
            sleep(delay)
    files, size = _tally(dest)
    done = Fetched(uri, repo, revision, commit, dest, files, size)
    record = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(done).items()}
    # Last: the directory counts as complete only now. A name of its own per writer: two pods
    # filling one claim at once each rename a whole file (the last one wins, both complete).
    tmp = dest / f"{FETCHED_MARKER}.{os.getpid()}.{time.monotonic_ns()}"
    try:
        tmp.write_text(json.dumps(record, indent=1))
        tmp.replace(dest / FETCHED_MARKER)
    except OSError as exc:
        raise FetchError(
            "cache", f"cannot write the model cache at {dest}: {exc}", uri=uri
        ) from exc
    return done
