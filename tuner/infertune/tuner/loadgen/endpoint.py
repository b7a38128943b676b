"""Where requests go and what they carry: the parsed URL, the OpenAI-style body, small GETs."""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

Api = Literal["completions", "chat"]
API_PATHS: dict[str, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where to send requests: parsed once from the user's URL."""

    host: str
    port: int
    tls: bool
    base_path: str
    api: Api = "completions"

    @classmethod
    def parse(cls, url: str, api: Api = "completions") -> Endpoint:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"--url {url!r}: scheme must be http or https")
        if not parts.hostname:
            raise ValueError(f"--url {url!r}: no host; write e.g. http://127.0.0.1:8000")
        if api not in API_PATHS:
            raise ValueError(f"api {api!r} is not supported; allowed values: {sorted(API_PATHS)}")
        tls = parts.scheme == "https"
        base = parts.path.rstrip("/")
        # Accept both http://host:8000 and http://host:8000/v1 as the base.
        base = base.removesuffix("/v1")
        return cls(parts.hostname, parts.port or (443 if tls else 80), tls, base, api)

    @property
    def path(self) -> str:
        return self.base_path + API_PATHS[self.api]

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


def request_body(
    endpoint: Endpoint,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body; output length is enforced so runs are comparable across engines."""
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": max_tokens}
    body["stream_options"] = {"include_usage": True}
    if endpoint.api == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
        body["max_completion_tokens"] = max_tokens
    else:
        body["prompt"] = prompt
    if ignore_eos:
        # vLLM, SGLang and llama.cpp honour it: the server produces exactly max_tokens. Not also
        # min_tokens: vLLM applies that as an extra logits processor, which slows every decode
        # step (measured ~15% TPOT on the tiny model) and would bias the comparison with peers.
        body["ignore_eos"] = True
    if extra:
        body.update(extra)
    return body


def encode_request(endpoint: Endpoint, body: dict[str, Any], api_key: str | None = None) -> bytes:
    payload = json.dumps(body, separators=(",", ":")).encode()
    auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
    head = (
        f"POST {endpoint.path} HTTP/1.1\r\nHost: {endpoint.host_header}\r\n"
        f"Content-Type: application/json\r\nAccept: text/event-stream\r\n{auth}"
        f"Content-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def fetch_json(endpoint: Endpoint, path: str, timeout: float = 10.0) -> Any:
    """GET a small JSON document (e.g. /v1/models); raises OSError/ValueError with a reason."""
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(
            endpoint.host, endpoint.port, ssl=ssl.create_default_context() if endpoint.tls else None
        ),
        timeout,
    )
    try:
        writer.write(
            f"GET {endpoint.base_path}{path} HTTP/1.1\r\nHost: {endpoint.host_header}\r\n"
            "Accept: application/json\r\nConnection: close\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        headers = head.decode("latin-1").lower()
        if "transfer-encoding: chunked" in headers:
            body = b""
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    break
                body += await reader.readexactly(size + 2)
                body = body[:-2]
        elif "content-length:" in headers:
            length = int(headers.split("content-length:", 1)[1].split("\r\n", 1)[0])
            body = await asyncio.wait_for(reader.readexactly(length), timeout)
        else:
            body = await asyncio.wait_for(reader.read(), timeout)
    except asyncio.IncompleteReadError as exc:
        raise ValueError(f"GET {path}: response cut short") from exc
    finally:
        writer.close()
    if " 200" not in status_line:
        raise ValueError(f"GET {path}: {status_line or 'no response'}")
    return json.loads(body)
