"""`infertune validate FILE...` and `infertune crds --out PATH`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from infertune.operator.crd import render_crd_yaml
from infertune.operator.validation import manifest_problems
from infertune.tuner.api import TuningSpec
from infertune.tuner.api.load import SpecError, read_documents, tuning_spec_from_document


def _check_document(doc: object, source: str) -> tuple[list[str], dict[str, object] | None]:
    """Problems, and the resolved spec (defaults filled in) when valid."""
    if isinstance(doc, dict) and doc.get("kind") == "InferenceService":
        problems = manifest_problems(doc)
        if problems:
            return problems, None
        from infertune.operator.api import InferenceService

        return [], InferenceService.model_validate(doc).spec.to_wire()
    try:
        spec: TuningSpec = tuning_spec_from_document(doc, source)
    except SpecError as exc:
        return exc.problems, None
    return [], spec.to_wire()


def validate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="infertune validate",
        description="Validate InferenceService manifests or TuningSpec files; print every error.",
    )
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument(
        "--show", action="store_true", help="print each resolved spec with defaults"
    )
    args = parser.parse_args(argv)
    failed = 0
    for path in args.files:
        try:
            docs = read_documents(path)
        except SpecError as exc:
            print(f"{path}: INVALID\n  - " + "\n  - ".join(exc.problems))
            failed += 1
            continue
        if not docs:
            print(f"{path}: INVALID\n  - the file holds no YAML document")
            failed += 1
            continue
        for index, doc in enumerate(docs):
            where = f"{path}" + (f" (document {index + 1})" if len(docs) > 1 else "")
            problems, resolved = _check_document(doc, where)
            if problems:
                failed += 1
                print(f"{where}: INVALID ({len(problems)} problem(s))")
                for problem in problems:
                    print(f"  - {problem}")
            else:
                print(f"{where}: valid")
                if args.show and resolved is not None:
                    print(yaml.safe_dump({"spec": resolved}, sort_keys=False), end="")
    return 1 if failed else 0


def crds_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="infertune crds", description=__doc__)
    parser.add_argument("--out", action="append", type=Path, help="file to write (repeatable)")
    args = parser.parse_args(argv)
    text = render_crd_yaml()
    if not args.out:
        sys.stdout.write(text)
        return 0
    for out in args.out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text, encoding="utf-8")
        print(f"wrote {out}")
    return 0
