"""Property test: >= 1,000 generated malformed InferenceServices, each rejected with a field-named message.

Every mutation below is invalid by construction (a value outside the documented range, a value not in
an enum, an unknown field, a wrong type, a hostile string), so each example must be rejected, the
message must start with the path of the mutated field (or one of its parents, for cross-field rules),
and validation must never raise anything else.
"""

from __future__ import annotations

import copy
import string
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infertune.operator.validation import manifest_problems

VALID: dict[str, Any] = {
    "apiVersion": "infertune.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "prop"},
    "spec": {
        "model": {"uri": "builtin://tiny", "name": "tiny"},
        "slo": {"ttft": {"max": "300ms", "percentile": "p95"}, "itl": {"max": "40ms"}},
        "traffic": {"rate": 5, "promptTokens": {"distribution": "fixed", "mean": 64}},
        "search": {
            "engines": ["builtin"],
            "maxNumSeqs": {"min": 1, "max": 64},
            "kvBlockSizes": [16],
        },
        "quality": {"minTop1Agreement": 0.9},
        "budget": {"maxTrials": 10, "parallelTrials": 1},
        "hardware": {"gpusPerReplica": 1, "gpuProducts": ["NVIDIA-H100-80GB-HBM3"]},
        "rollout": {"replicas": 2},
        "retune": {"checkInterval": "60s", "violationWindow": "5m"},
    },
}

# path -> strategy of values that are invalid at that path
NUMERIC_BAD = st.one_of(
    st.integers(max_value=0), st.integers(min_value=10**12), st.sampled_from([-1.5, float("inf")])
)
HOSTILE_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=300
).filter(lambda s: s.strip() not in ("", "p50", "p90", "p95", "p99"))
NOT_A_DURATION = st.one_of(
    st.sampled_from(["-1s", "0s", "0ms", "1 s", "1sec", "ms", "1.s", "∞s", "1e3ms", "300"]),
    st.text(alphabet=string.ascii_letters + "ー€ 🙂", min_size=1, max_size=50),
    st.integers(),
    st.floats(allow_nan=True),
    st.lists(st.integers(), max_size=2),
)
WRONG_TYPE = st.one_of(
    st.lists(st.integers(), min_size=1, max_size=3), st.booleans().map(lambda b: {"x": b})
)

MUTATIONS: list[tuple[tuple[str, ...], st.SearchStrategy[Any]]] = [
    (("slo", "ttft", "max"), NOT_A_DURATION),
    (("slo", "itl", "max"), NOT_A_DURATION),
    (("retune", "checkInterval"), NOT_A_DURATION),
    (("slo", "ttft", "percentile"), HOSTILE_TEXT),
    (
        ("slo", "objective"),
        HOSTILE_TEXT.filter(lambda s: s not in ("goodput", "throughput", "cost-per-token")),
    ),
    (
        ("traffic", "rate"),
        st.one_of(
            st.integers(max_value=0), st.floats(max_value=0, allow_nan=False), st.just(10**9)
        ),
    ),
    (
        ("traffic", "arrival"),
        HOSTILE_TEXT.filter(lambda s: s not in ("poisson", "constant", "gamma")),
    ),
    (("traffic", "promptTokens", "mean"), NUMERIC_BAD),
    (
        ("search", "engines"),
        st.lists(
            HOSTILE_TEXT.filter(lambda s: s not in ("builtin", "vllm", "llamacpp", "sglang")),
            min_size=1,
            max_size=3,
        ),
    ),
    (
        ("search", "kvBlockSizes"),
        st.lists(
            st.integers().filter(lambda n: n < 1 or n > 256 or n & (n - 1) != 0),
            min_size=1,
            max_size=4,
        ),
    ),
    (
        ("search", "maxNumSeqs", "max"),
        st.one_of(st.integers(max_value=0), st.integers(min_value=2_000_000)),
    ),
    (
        ("search", "sampler"),
        HOSTILE_TEXT.filter(lambda s: s not in ("tpe", "nsga2", "gp", "random", "grid")),
    ),
    (
        ("quality", "minTop1Agreement"),
        st.one_of(
            st.floats(max_value=-0.001, allow_nan=False),
            st.floats(min_value=1.001, allow_infinity=False),
        ),
    ),
    (("budget", "maxTrials"), NUMERIC_BAD),
    (("budget", "parallelTrials"), st.one_of(st.integers(max_value=0), st.integers(min_value=65))),
    (
        ("hardware", "gpusPerReplica"),
        st.one_of(st.integers(max_value=-1), st.integers(min_value=65)),
    ),
    (
        ("hardware", "gpuProducts"),
        st.lists(
            st.text(alphabet=" !@#$%^&*()/\\é🙂", min_size=1, max_size=70), min_size=1, max_size=2
        ),
    ),
    (("rollout", "replicas"), st.one_of(st.integers(max_value=-1), st.integers(min_value=1001))),
    (
        ("model", "uri"),
        st.one_of(
            st.sampled_from(
                [
                    "../../etc/passwd",
                    "file:///models/../../root",
                    "pvc://claim/../x",
                    "s3://b/k",
                    "builtin://huge",
                    "ftp://x",
                    "pvc:///nopvc",
                    "",
                ]
            ),
            st.text(min_size=4097, max_size=4200),
        ),
    ),
    (
        ("model", "name"),
        st.one_of(
            st.text(min_size=254, max_size=300),
            st.sampled_from(["-bad", "a b", "x;rm -rf /", "$(id)", "ü"]),
        ),
    ),
    (("model",), WRONG_TYPE),
    (("slo",), st.one_of(st.just({}), st.just({"objective": "goodput"}), WRONG_TYPE)),
    (("search",), st.lists(st.integers(), min_size=1, max_size=2)),
]

UNKNOWN_KEY = st.text(alphabet=string.ascii_letters, min_size=1, max_size=40)


def _set(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> bool:
    """Set the value; False when an earlier mutation already replaced a parent with a non-mapping."""
    node = doc["spec"]
    for part in path[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            return False
    node[path[-1]] = value
    return True


@st.composite
def malformed(draw: st.DrawFn) -> tuple[dict[str, Any], list[str]]:
    doc = copy.deepcopy(VALID)
    expected_paths: list[str] = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        if draw(st.integers(0, 5)) == 0:  # an unknown field somewhere
            where = draw(
                st.sampled_from(
                    [(), ("slo",), ("traffic",), ("search",), ("hardware",), ("rollout", "canary")]
                )
            )
            name = draw(UNKNOWN_KEY)
            name += "Zz"  # no real field ends so, so the key is always unknown
            if _set(doc, (*where, name), draw(st.integers())):
                expected_paths.append(".".join(("spec", *where, name)))
        else:
            path, strategy = draw(st.sampled_from(MUTATIONS))
            if _set(doc, path, draw(strategy)):
                expected_paths.append(".".join(("spec", *path)))
    return doc, expected_paths


def _related(message: str, paths: list[str]) -> bool:
    field = message.split(":", 1)[0]
    bare = field.split("[", 1)[0]
    return any(p.startswith(bare) or bare.startswith(p.split("[", 1)[0]) for p in paths)


@settings(
    max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)
@given(malformed())
def test_generated_malformed_specs_are_rejected_with_field_named_messages(
    case: tuple[dict[str, Any], list[str]],
) -> None:
    doc, paths = case
    problems = manifest_problems(doc)  # must not raise
    assert problems, f"accepted a malformed spec mutated at {paths}"
    for message in problems:
        assert message.startswith("spec"), message
        assert ": " in message, message
    assert any(_related(m, paths) for m in problems), (paths, problems)
