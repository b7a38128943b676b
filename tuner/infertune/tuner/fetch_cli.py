"""`infertune fetch-model`: the pods' init step for hf:// models (hub_fetch.fetch, once per cache).

    infertune fetch-model hf://ORG/NAME@REV [hf://ORG/NAME-AWQ ...] --termination-message PATH

Each URI lands in models.hf_local_dir under $INFERTUNE_MODEL_CACHE (the model cache volume's mount
point, set by the operator). The token is $HF_TOKEN (from the Secret the spec names, never on the
command line), the Hub $HF_ENDPOINT when set. On failure the termination message is one JSON
object (hub_fetch.FetchError.to_json: what failed, the Hub's status code, reason and X-Error-Code)
that the operator turns into the InferenceService's condition; the exit code says whether a retry
can help (EXIT_PERMANENT: a missing repository or revision, a refused token) or not yet
(EXIT_TRANSIENT: the network or the Hub, after hub_fetch's bounded retries).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from infertune.tuner.api.model import check_model_uri
from infertune.tuner.hub_fetch import FetchError, fetch
from infertune.tuner.models import hf_local_dir, scheme_of

EXIT_PERMANENT = 3
EXIT_TRANSIENT = 4


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="infertune fetch-model", description=__doc__.split("\n", 1)[0])
    p.add_argument("uris", nargs="+", metavar="URI", help="hf://NAMESPACE/NAME[@REVISION]")
    p.add_argument(
        "--format",
        choices=("safetensors", "gguf"),
        default="safetensors",
        help="model.format: safetensors skips other formats' weights beside them; gguf fetches all",
    )
    p.add_argument(
        "--termination-message", type=Path, default=None, help="file for the outcome (JSON)"
    )
    return p


def _write(path: Path | None, record: dict[str, object]) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, separators=(",", ":"))[:4000])  # kubelet keeps 4 KiB


def fetch_model_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        from huggingface_hub import disable_progress_bars

        disable_progress_bars()  # one line per model in the pod's log, not a bar per file
    except ImportError:
        pass
    done: list[dict[str, object]] = []
    for uri in args.uris:
        try:
            check_model_uri(uri)
            if scheme_of(uri) != "hf":
                raise ValueError(f"{uri!r}: only hf:// models are fetched")
        except ValueError as exc:
            print(f"infertune fetch-model: {exc}", file=sys.stderr)
            _write(args.termination_message, {"uri": uri, "what": "uri", "message": str(exc)})
            return 2
        try:
            got = fetch(uri, hf_local_dir(uri), fmt=args.format)
        except FetchError as err:
            print(f"infertune fetch-model: {uri}: {err.message}", file=sys.stderr)
            _write(args.termination_message, err.to_json())
            return EXIT_PERMANENT if err.permanent else EXIT_TRANSIENT
        print(
            f"infertune fetch-model: {uri} at commit {got.commit}: {got.files} files, "
            f"{got.bytes / 2**20:.1f} MiB in {got.directory}",
            flush=True,
        )
        done.append({"uri": uri, "commit": got.commit, "bytes": got.bytes})
    _write(args.termination_message, {"fetched": done})
    return 0


if __name__ == "__main__":
    sys.exit(fetch_model_main())
