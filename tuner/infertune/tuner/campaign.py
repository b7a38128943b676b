"""One tuning run's use of its study: warm start from earlier studies, explore, race the best.

`infertune tune` (tune.py) and the search benchmark (benchmarks/bench_search.py) both go through
here, so the replay measures what a tuning run does:

1. **Warm start** (warm_start.py): earlier studies of the same model and engines in the storage
   seed this one -- their best configurations enqueued, their trials transferred to the sampler,
   down-weighted by how far traffic and hardware moved. A new study only; none for NSGA-II.
2. **Explore** (search.run_study): the seeds, then the sampler, on the budget less the race's share.
3. **Race** (racing.py): the best few re-measured in alternation until their order is settled; the
   winner is the best mean, with its advantage over the runner-up and over the engine's default.
   Multi-objective studies report a Pareto front instead and do not race.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import optuna

from infertune.tuner.api import TuningSpec
from infertune.tuner.candidate import Candidate
from infertune.tuner.cost import CostBasis
from infertune.tuner.process import in_child
from infertune.tuner.racing import RaceResult, explore_then_race
from infertune.tuner.result import TuningResult
from infertune.tuner.search import Evaluation, ReportFn, run_study
from infertune.tuner.space import Space
from infertune.tuner.warm_start import (
    Context,
    WarmStart,
    find_priors,
    mark,
    seed_study,
    warm_key,
)


@dataclass
class Campaign:
    race: RaceResult | None
    warm: WarmStart = field(default_factory=WarmStart)


def engine_default(space: Space, *, gpu: bool = False) -> Candidate | None:
    """The configuration an engine runs with no tuning flag, when the space searches its engine.

    Only the built-in engine's is known here (its own argument parser's defaults); vLLM's and
    SGLang's defaults depend on the GPU and the model, so no advantage over them is claimed. The
    built-in engine's default precision is "auto" (engine/precision.py: the faster of fp32 and
    bf16, timed on this host at the engine's decode thread count); it is resolved by that same
    rule in a child process (the tuner sets no torch threads of its own). On a GPU the answer
    needs the GPU, which the tuner leaves to its trials: no default is compared there."""
    if "builtin" not in space.engines:
        return None
    from infertune.engine.cli import build_serve_parser

    a = build_serve_parser().parse_args(["--model", "default"])
    quantization = a.quantization
    if quantization == "auto":
        if gpu:
            return None
        quantization = in_child(auto_precision)
    return Candidate(
        "builtin",
        quantization,
        a.max_num_seqs,
        a.max_num_batched_tokens,
        a.kv_block_size,
        bool(a.cuda_graph),
    )


def auto_precision() -> str:
    """What `infertune serve --quantization auto` picks on this CPU (engine/build.py's rule)."""
    import torch

    from infertune.engine.build import default_threads
    from infertune.engine.precision import fastest

    torch.set_num_threads(default_threads())
    return fastest("cpu")


def run_campaign(
    study: optuna.Study,
    space: Space,
    spec: TuningSpec,
    evaluate: Callable[[Candidate, ReportFn], Evaluation],
    *,
    hardware: str,
    gpu: bool = False,
    max_trials: int,
    max_seconds: float,
    multi_objective: bool = False,
    cost: CostBasis | None = None,
    log: Callable[[str], None] = print,
    **explore: Any,
) -> Campaign:
    """`explore`: run_study's remaining keywords (progress, stale_after, plan_next)."""
    mark(study, spec, space, hardware)
    if multi_objective:
        run_study(study, space, spec, evaluate, max_trials=max_trials, max_seconds=max_seconds,
                  multi_objective=True, cost=cost, **explore)  # fmt: skip
        return Campaign(None)
    priors = find_priors(study._storage, warm_key(spec, space), study.study_name, spec)
    warm = seed_study(study, space, spec, Context.of(spec, hardware), priors)
    if warm.studies:
        log(
            f"warm start from {', '.join(warm.studies)} (weights "
            f"{', '.join(f'{w:.2f}' for w in warm.weights)}): {len(warm.enqueued)} of their best "
            f"enqueued, {warm.transferred} trials transferred to the sampler"
        )
    race = explore_then_race(
        study,
        space,
        spec,
        evaluate,
        max_trials=max_trials,
        max_seconds=max_seconds,
        baseline=engine_default(space, gpu=gpu),
        cost=cost,
        log=log,
        **explore,
    )
    if race.winner is not None:
        log(f"race: {race.reason}; winner {race.winner.label()}")
    return Campaign(race, warm)


def apply(result: TuningResult, campaign: Campaign) -> None:
    """The race's winner becomes the result's best (its latest feasible measurement stands for
    it; the race's means and intervals go beside it), and the warm start is recorded."""
    result.warm_start = campaign.warm.to_dict() if campaign.warm.studies else None
    race = campaign.race
    if race is None:
        return
    result.race = race.to_dict()
    if race.winner is None or result.status != "succeeded":
        return
    wire = race.winner.to_dict()
    mine = [r for r in result.trials if r.feasible and r.config == wire]
    if mine:
        result.best = mine[-1]
