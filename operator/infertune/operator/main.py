"""`infertune operator`: run the kopf operator with the settings from flags and environment."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
from collections.abc import Sequence

import kopf

from infertune.operator.handlers import build_registry, kopf_settings
from infertune.operator.resilient_watch import WatchGaveUpError, install
from infertune.operator.settings import parse_settings


class _QuietTimers(logging.Filter):
    """The SLO timer runs every few seconds per object; its 'succeeded' lines would drown the log."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Timer ") and message.endswith("succeeded."))


def operator_main(argv: Sequence[str]) -> int:
    settings, args = parse_settings(argv)
    kopf.configure(verbose=args.verbose, log_prefix=True)
    if not args.verbose:
        logging.getLogger("kopf.objects").addFilter(_QuietTimers())
    clusterwide = settings.all_namespaces or not settings.namespaces
    if not settings.namespaces and not settings.all_namespaces:
        logging.getLogger("infertune.operator").info(
            "no --namespace given: watching all namespaces"
        )
    memo = kopf.Memo(op_settings=settings, kubeconfig=os.environ.get("KUBECONFIG") or None)
    liveness = (
        f"http://0.0.0.0:{settings.health_port}/healthz"
        if settings.health_port is not None
        else None
    )
    install()  # watches ride out an API server's restart instead of ending the operator
    try:
        asyncio.run(
            kopf.operator(
                registry=build_registry(settings),
                settings=kopf_settings(settings),
                memo=memo,
                clusterwide=clusterwide,
                namespaces=list(settings.namespaces),
                standalone=settings.peering is None,
                peering_name=settings.peering,
                # Replicas of one Deployment share their args, and kopf pauses every peer that ties
                # for the top priority: a random priority per process lets exactly one be active.
                priority=secrets.randbelow(1_000_000) + 1 if settings.peering else 0,
                liveness_endpoint=liveness,
            )
        )
    except KeyboardInterrupt:
        return 0
    except WatchGaveUpError as exc:
        logging.getLogger("infertune.operator").error("operator stopped: %s", exc)
        return 1
    return 0
