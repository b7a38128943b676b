"""What the server process and the engine-core process say to each other over their socket.

Both ends import this module (and :mod:`infertune.engine.serve_config`, :mod:`infertune.engine.engine`
for the event and gauge types); neither imports the other's. In order:

* server -> core, once: ``(ServeConfig, model_dir)``, the recipe for the runner and the engine.
* core -> server, once: ``("ready", RunnerInfo)`` after the warm-up, or ``("error", message)``
  when the runner cannot be built (a knob this setup cannot run, a missing model).
* server -> core, any time: ``("add", Sequence, arrival)`` and ``("abort", seq_id)``.
* core -> server, after each step that changed anything: ``(events, stats)``, the step's
  ``(seq_id, TokenEvent)`` pairs and a copy of its :class:`~infertune.engine.engine.EngineStats`.

The server closes the socket to stop the core.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RunnerInfo"]


@dataclass(frozen=True)
class RunnerInfo:
    """The built runner, as the server needs it (request validation, the ready log line)."""

    num_kv_blocks: int
    block_size: int
    weight_bytes: int
