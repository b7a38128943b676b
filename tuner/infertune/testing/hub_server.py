"""A local HTTP server in the Hugging Face Hub's URL layout, for the real huggingface_hub client.

Serves every directory ROOT/NAMESPACE/NAME (or ROOT/NAME) as a model repository with one branch,
`main`, whose commit hash is a digest of its files. The routes and headers are the ones
huggingface_hub 2.x calls and reads (hf_api.py, file_download.py, utils/_http.py):

    GET  /api/models/{repo}[/revision/{rev}]   model info: id, sha (the commit), siblings, gated
    GET  /api/models/{repo}/tree/{rev}[/path]  the file listing (type, oid, size, path, lfs)
    HEAD /{repo}/resolve/{rev}/{file}          X-Repo-Commit, ETag (X-Linked-Etag, X-Linked-Size
                                               for LFS files), Content-Length
    GET  /{repo}/resolve/{rev}/{file}          the bytes (Range: bytes=N- resumes)

and its errors, as the Hub answers them: a missing repository 404 `X-Error-Code: RepoNotFound`,
a missing revision 404 `RevisionNotFound`, a missing file 404 `EntryNotFound`; a gated
repository's files 401 `GatedRepo` without a token and 403 `GatedRepo` with a token that has no
access; an unknown token 401 `X-Error-Message: Invalid credentials in Authorization header`.
`fail_next` answers the next N requests 503, for retry tests. Every request is recorded (method,
path, whether it carried a token) so tests can count them; tokens themselves are not kept.

    python -m infertune.testing.hub_server ROOT [--port N]   # then HF_ENDPOINT=http://127.0.0.1:N
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


@dataclass
class Repo:
    root: Path
    files: dict[str, Path]
    commit: str

    @classmethod
    def load(cls, root: Path) -> Repo:
        files = {
            p.relative_to(root).as_posix(): p
            for p in sorted(root.rglob("*"))
            if p.is_file() and not p.name.startswith(".")
        }
        digest = hashlib.sha1(usedforsecurity=False)
        for rel, path in files.items():
            digest.update(rel.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
        return cls(root, files, digest.hexdigest())

    def entry(self, rel: str) -> dict[str, Any]:
        data = self.files[rel].read_bytes()
        out: dict[str, Any] = {
            "type": "file",
            "oid": hashlib.sha1(
                b"blob %d\0" % len(data) + data, usedforsecurity=False
            ).hexdigest(),  # git's blob id
            "size": len(data),
            "path": rel,
        }
        if rel.endswith(LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            out["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
        return out


@dataclass
class HubState:
    root: Path
    tokens: set[str] = field(default_factory=set)  # tokens the server knows
    gated: dict[str, set[str]] = field(default_factory=dict)  # repo -> tokens with access
    fail_next: int = 0
    requests: list[tuple[str, str, bool]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def repo(self, repo_id: str) -> Repo | None:
        path = self.root / repo_id
        if not repo_id or ".." in repo_id.split("/") or not path.is_dir():
            return None
        return Repo.load(path)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read HubState.requests instead

    def do_GET(self) -> None:
        self._serve(body=True)

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def _answer(
        self,
        status: int,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        send: bool = True,
    ) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send and body:
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str, send: bool) -> None:
        headers = {"X-Error-Message": message, "Content-Type": "application/json"}
        if code:
            headers["X-Error-Code"] = code
        self._answer(status, json.dumps({"error": message}).encode(), headers, send)

    def _json(self, obj: Any) -> None:
        self._answer(200, json.dumps(obj).encode(), {"Content-Type": "application/json"})

    def _serve(self, body: bool) -> None:
        state = self.server.state
        auth = self.headers.get("Authorization", "")
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        path = unquote(urlsplit(self.path).path)
        with state.lock:
            state.requests.append((self.command, path, token is not None))
            failing = state.fail_next > 0
            state.fail_next -= 1 if failing else 0
        if failing:
            return self._error(503, None, "Service Unavailable", body)
        if token is not None and token not in state.tokens:
            return self._error(401, None, "Invalid credentials in Authorization header", body)
        if path.startswith("/api/models/"):
            return self._api(path[len("/api/models/") :], token, body)
        if "/resolve/" in path:
            repo_id, _, rest = path.strip("/").partition("/resolve/")
            rev, _, rel = rest.partition("/")
            return self._file(repo_id, rev, rel, token, body)
        return self._error(404, None, "Not Found", body)

    def _revision(self, repo: Repo, rev: str, send: bool) -> bool:
        if rev in ("main", repo.commit):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", send)
        return False

    def _api(self, rest: str, token: str | None, send: bool) -> None:
        state = self.server.state
        for key in ("/revision/", "/tree/"):
            if key in rest:
                repo_id, _, tail = rest.partition(key)
                break
        else:
            repo_id, key, tail = rest.strip("/"), "/revision/", "main"
        repo = state.repo(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found", send)
        rev = tail.split("/", 1)[0]
        if not self._revision(repo, rev, send):
            return None
        if key == "/tree/":
            return self._json([repo.entry(rel) for rel in repo.files])
        gated = "manual" if repo_id in state.gated else False
        return self._json(
            {
                "_id": repo.commit[:24],
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": gated,
                "disabled": False,
                "tags": [],
                "siblings": [{"rfilename": rel} for rel in repo.files],
            }
        )

    def _file(self, repo_id: str, rev: str, rel: str, token: str | None, send: bool) -> None:
        state = self.server.state
        repo = state.repo(repo_id)
        if repo is None:
            return self._error(404, "RepoNotFound", "Repository not found", send)
        allowed = state.gated.get(repo_id)
        if allowed is not None and token is None:
            return self._error(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
                send,
            )
        if allowed is not None and token not in allowed:
            return self._error(
                403,
                "GatedRepo",
                f"Access to model {repo_id} is restricted and you are not in the authorized list.",
                send,
            )
        if not self._revision(repo, rev, send):
            return None
        if rel not in repo.files:
            return self._error(404, "EntryNotFound", "Entry not found", send)
        entry = repo.entry(rel)
        data = repo.files[rel].read_bytes()
        etag = entry["lfs"]["oid"] if "lfs" in entry else entry["oid"]
        headers = {
            "X-Repo-Commit": repo.commit,
            "ETag": f'"{etag}"',
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if "lfs" in entry:
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
        start = 0
        wanted = self.headers.get("Range", "")
        if wanted.startswith("bytes=") and wanted[6:].split("-")[0].isdigit():
            start = int(wanted[6:].split("-")[0])
        part = data[start:]
        headers["Content-Length"] = str(len(part))
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._answer(206 if start else 200, part, headers, send)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: HubState


class HubServer:
    """The server on 127.0.0.1 in a daemon thread; `endpoint` is what HF_ENDPOINT takes."""

    def __init__(self, root: Path, *, port: int = 0, **state: Any) -> None:
        self.state = HubState(root=Path(root), **state)
        self._server = _Server(("127.0.0.1", port), _Handler)
        self._server.state = self.state
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def commit(self, repo_id: str) -> str:
        repo = self.state.repo(repo_id)
        assert repo is not None, repo_id
        return repo.commit

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infertune.testing.hub_server")
    p.add_argument("root", type=Path)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--token", action="append", default=[], help="a token the server knows")
    p.add_argument("--gated", action="append", default=[], help="REPO=TOKEN[,TOKEN]")
    args = p.parse_args(argv)
    gated = {}
    for spec in args.gated:
        repo, _, toks = spec.partition("=")
        gated[repo] = {t for t in toks.split(",") if t}
    server = HubServer(args.root, port=args.port, tokens=set(args.token), gated=gated)
    print(server.endpoint, flush=True)
    server._server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
