"""A minimal JSON REST client for the node agent (stdlib only, one keep-alive connection per thread).

The agent works on raw API JSON: that keeps it independent of the python client's generated
models (which lag or lead the 1.20 server) and lets the scheduler code read fields as the API
spells them.
"""

from __future__ import annotations

import http.client
import json
import ssl
import threading
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

Obj = dict[str, Any]


class ApiError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status
        self.body = body


class Kube:
    def __init__(self, kubeconfig: Path) -> None:
        cfg = yaml.safe_load(Path(kubeconfig).read_text())
        ctx_name = cfg["current-context"]
        ctx = next(c["context"] for c in cfg["contexts"] if c["name"] == ctx_name)
        cluster = next(c["cluster"] for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        user = next(u["user"] for u in cfg["users"] if u["name"] == ctx["user"])
        url = urllib.parse.urlsplit(cluster["server"])
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.token: str = user["token"]
        self.ssl = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn: http.client.HTTPSConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self.host, self.port, context=self.ssl, timeout=30)
            self._local.conn = conn
        return conn

    def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> Obj:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {self.token}", "Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in range(2):  # one retry on a keep-alive connection the server closed
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                raw = resp.read().decode()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self._local.conn = None
                if attempt == 1:
                    raise
        if resp.status >= 400:
            raise ApiError(resp.status, raw)
        return json.loads(raw) if raw else {}

    def get(self, path: str) -> Obj:
        return self.request("GET", path)

    def create(self, path: str, body: Obj) -> Obj:
        return self.request("POST", path, body)

    def merge_patch(self, path: str, body: Obj) -> Obj:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def strategic_patch(self, path: str, body: Obj) -> Obj:
        return self.request(
            "PATCH", path, body, content_type="application/strategic-merge-patch+json"
        )

    def delete(self, path: str, body: Obj | None = None) -> Obj:
        return self.request("DELETE", path, body)

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
