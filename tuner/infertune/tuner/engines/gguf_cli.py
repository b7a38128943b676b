"""`infertune gguf`: a checkpoint as the GGUF file llama.cpp serves, for one precision.

The llama.cpp Deployment runs this in an init container (the project's image) and the server loads
the file from a shared emptyDir, so the pod serves exactly the weights the tuner measured: the same
converter and quantizer the llamacpp adapter used in the trial.

    infertune gguf --model builtin://tiny --quantization int4 --out /gguf/model.gguf
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from infertune.tuner.api import ModelSource
from infertune.tuner.candidate import Candidate
from infertune.tuner.engines.llamacpp import GGUF_PRECISIONS, LlamaCppAdapter
from infertune.tuner.models import resolve_model


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="infertune gguf", description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", required=True, help="model URI or checkpoint directory")
    p.add_argument("--quantization", required=True, choices=sorted(GGUF_PRECISIONS))
    p.add_argument("--out", type=Path, required=True, help="the GGUF file to write")
    return p


def gguf_main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        model_dir = resolve_model(ModelSource(uri=args.model))
    except ValueError as exc:
        print(f"infertune gguf: {exc}", file=sys.stderr)
        return 2
    config = Candidate("llamacpp", args.quantization, 1, 512, 16, False)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # Convert beside the output (same filesystem: the final step is a rename, never a half file).
    with tempfile.TemporaryDirectory(dir=args.out.parent, prefix=".gguf-") as work:
        made = LlamaCppAdapter().prepare_model(model_dir, config, Path(work))
        if made == model_dir:  # already a GGUF file: copy it, the source may be read-only
            shutil.copyfile(made, Path(work) / "copy.gguf")
            made = Path(work) / "copy.gguf"
        made.replace(args.out)
    print(f"infertune gguf: wrote {args.out} ({args.out.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(gguf_main())
