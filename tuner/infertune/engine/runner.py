"""ModelRunner: owns the model weights, the paged KV cache and every device side effect.

Contract with the scheduler (torch-free, in ``scheduler.py``): each engine step the scheduler
hands a list of :class:`StepInput` (one per scheduled sequence) to :meth:`ModelRunner.execute`,
which returns one sampled token (or ``None``) per input, in the same order.

```python
class ModelRunner:
    def __init__(self, model_dir, *, quantization="fp32", kv_block_size=16,
                 num_kv_blocks=None, kv_cache_bytes=None, device="cpu",
                 cuda_graph=False, max_num_seqs=32, seed=0): ...
    config: LlamaConfig
    num_kv_blocks: int        # derived from kv_cache_bytes when num_kv_blocks is None
    block_size: int           # = kv_block_size; the engine sizes its BlockManager from these two
    def execute(self, batch: list[StepInput]) -> list[int | None]: ...
    def kv_bytes_per_block(self) -> int: ...
    def weight_bytes(self) -> int: ...
```

``SamplingParams`` and ``StepInput`` are defined in the torch-free ``step.py`` (so the scheduler
never imports torch) and re-exported here.

Sampling with a ``seed`` is reproducible and stateless: the generator for a token is seeded
from ``(seed, position)``, so a preempted-and-recomputed sequence samples the same tokens.
"""

from __future__ import annotations

from pathlib import Path

import torch

from infertune.engine.checkpoint import load_tensors
from infertune.engine.config import LlamaConfig
from infertune.engine.cuda_graphs import DecodeGraphs
from infertune.engine.model import BatchMeta, LlamaModel, PrefillChunk
from infertune.engine.quant import UnsupportedConfig
from infertune.engine.step import InputLogprobs, SamplingParams, StepInput, TokenLogprob

__all__ = [
    "InputLogprobs",
    "ModelRunner",
    "SamplingParams",
    "StepInput",
    "TokenLogprob",
    "UnsupportedConfig",
]

DEFAULT_KV_CACHE_BYTES = 256 * 1024 * 1024
# Steps of at least this many tokens run on the prefill thread count. Measured on this 2-core
# CPU (tiny model): 2 threads run 4x128 or 8x128 prefill steps 1.6-1.7x faster than 1, a
# 2x32 step no faster, and decode steps slower (per-op barriers).
PARALLEL_STEP_TOKENS = 128


class ModelRunner:
    def __init__(
        self,
        model_dir: Path | str,
        *,
        quantization: str = "fp32",
        kv_block_size: int = 16,
        num_kv_blocks: int | None = None,
        kv_cache_bytes: int | None = None,
        device: str = "cpu",
        cuda_graph: bool = False,
        max_num_seqs: int = 32,
        seed: int = 0,
        int4_group_size: int = 64,
        max_model_len: int | None = None,
        threads: tuple[int, int] | None = None,
    ) -> None:
        """``threads``: torch threads for (small, large) steps on CPU; ``None`` leaves torch's."""
        if kv_block_size < 1:
            raise UnsupportedConfig(f"kv_block_size={kv_block_size} must be a positive integer")
        if cuda_graph and not device.startswith("cuda"):
            raise UnsupportedConfig(
                f"cuda_graph=True needs a CUDA device, got device={device!r}; "
                "use cuda_graph=False on this machine"
            )
        self.model_dir = Path(model_dir)
        self.config = LlamaConfig.from_dir(self.model_dir)
        self.quantization = quantization
        self.device = device
        self.block_size = kv_block_size
        self.max_num_seqs = max_num_seqs
        self.threads = threads if not device.startswith("cuda") else None
        self.model = LlamaModel(
            self.config,
            load_tensors(self.model_dir),
            quantization=quantization,
            device=device,
            group_size=int4_group_size,
        )
        if num_kv_blocks is None:
            budget = DEFAULT_KV_CACHE_BYTES if kv_cache_bytes is None else kv_cache_bytes
            num_kv_blocks = budget // self.kv_bytes_per_block()
        if num_kv_blocks < 1:
            raise UnsupportedConfig(
                f"kv_cache_bytes={kv_cache_bytes} holds no KV block of "
                f"{self.kv_bytes_per_block()} bytes (kv_block_size={kv_block_size})"
            )
        self.num_kv_blocks = int(num_kv_blocks)
        # With CUDA Graphs one extra block is the scratch slot of the graphs' padding rows.
        total_blocks = self.num_kv_blocks + (1 if cuda_graph else 0)
        self.kv_cache = self.model.allocate_kv_cache(total_blocks, kv_block_size)
        self._generator = torch.Generator(device="cpu").manual_seed(seed)
        # Set by forward_logits only for a step in which some input asked for log-probabilities.
        self._score_logits: torch.Tensor | None = None
        self._score_spans: dict[int, tuple[int, int]] = {}
        self._logprobs: dict[int, InputLogprobs] = {}
        self.cuda_graph = cuda_graph
        self._graphs: DecodeGraphs | None = None
        if cuda_graph:
            self._graphs = DecodeGraphs(
                self.model,
                self.kv_cache,
                block_size=kv_block_size,
                max_num_seqs=max_num_seqs,
                max_model_len=max_model_len or self.config.max_position_embeddings,
                scratch_block=self.num_kv_blocks,
            )

    def kv_bytes_per_block(self) -> int:
        cfg = self.config
        elem = torch.empty((), dtype=self.model.dtype).element_size()
        return 2 * cfg.num_hidden_layers * cfg.kv_size * self.block_size * elem

    def weight_bytes(self) -> int:
        return self.model.weight_bytes

    @torch.inference_mode()
    def execute(self, batch: list[StepInput]) -> list[int | None]:
        """Run one step for ``batch``; one sampled token (or ``None``) per input, in order."""
        if not batch:
            return []
        logits, sampled_inputs = self.forward_logits(batch)
        tokens = self._sample(
            logits, [batch[i].sampling for i in sampled_inputs], batch, sampled_inputs
        )
        out: list[int | None] = [None] * len(batch)
        for i, tok in zip(sampled_inputs, tokens, strict=True):
            out[i] = tok
        if self._score_logits is not None:  # some input asked for log-probabilities
            self._logprobs = self._gather_logprobs(batch, logits, sampled_inputs, out)
        return out

    def take_logprobs(self) -> dict[int, InputLogprobs]:
        """The last :meth:`execute`'s log-probabilities by input index (only inputs that asked
        for them, ``StepInput.logprobs``); empty when none did. Cleared by the call."""
        out, self._logprobs = self._logprobs, {}
        return out

    def _gather_logprobs(
        self,
        batch: list[StepInput],
        logits: torch.Tensor,
        sampled_inputs: list[int],
        tokens: list[int | None],
    ) -> dict[int, InputLogprobs]:
        """Log-softmax (of the raw logits, before temperature: what vLLM reports by default)
        and top-k for the inputs that asked; computed here only, never on a step that did not."""
        score_logits, score_spans = self._score_logits, self._score_spans
        self._score_logits, self._score_spans = None, {}
        assert score_logits is not None
        out: dict[int, InputLogprobs] = {}
        rows = {i: r for r, i in enumerate(sampled_inputs)}
        for i, step in enumerate(batch):
            if step.logprobs is None:
                continue
            k = max(0, step.logprobs)
            got = InputLogprobs()
            span = score_spans.get(i)
            if span is not None and step.score_ids:
                start, stop = span
                got.prompt = _logprob_rows(
                    score_logits[start:stop], step.score_ids, step.start_pos + 1, k
                )
            tok = tokens[i]
            if i in rows and tok is not None:
                position = step.start_pos + len(step.token_ids)
                got.sampled = _logprob_rows(logits[rows[i] : rows[i] + 1], [tok], position, k)[0]
            out[i] = got
        return out

    @torch.inference_mode()
    def forward_logits(self, batch: list[StepInput]) -> tuple[torch.Tensor, list[int]]:
        """fp32 logits for every input with ``sample=True`` and those inputs' indices."""
        bs = self.block_size
        # Decode rows (one token, something cached) first so attention can batch them.
        order = sorted(range(len(batch)), key=lambda i: 0 if self._is_decode(batch[i]) else 1)
        tokens: list[int] = []
        positions: list[int] = []
        slot_blocks: list[int] = []
        slot_offsets: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        sample_rows: list[int] = []
        sampled_inputs: list[int] = []
        score_rows: list[int] = []  # rows whose logits score the prompt's next tokens (echo)
        score_spans: dict[int, tuple[int, int]] = {}  # input -> its span of score_rows
        wants_logprobs = False
        for i in order:
            step = batch[i]
            if step.logprobs is not None:
                wants_logprobs = True
                if step.score_ids:
                    first = len(score_rows)
                    score_rows.extend(range(len(tokens), len(tokens) + len(step.score_ids)))
                    score_spans[i] = (first, len(score_rows))
            n = len(step.token_ids)
            end = step.start_pos + n
            self._check(step, end)
            row = len(tokens)
            tokens.extend(step.token_ids)
            pos = range(step.start_pos, end)
            positions.extend(pos)
            slot_blocks.extend(step.block_table[p // bs] for p in pos)
            slot_offsets.extend(p % bs for p in pos)
            if self._is_decode(step):
                decode_tables.append(step.block_table[: (end + bs - 1) // bs])
                decode_lens.append(end)
            else:
                table = torch.tensor(step.block_table[: (end + bs - 1) // bs], dtype=torch.int64)
                prefills.append(PrefillChunk(row, n, step.start_pos, table.to(self.device)))
            if step.sample:
                sample_rows.append(row + n - 1)
                sampled_inputs.append(i)
        width = max((len(t) for t in decode_tables), default=0)
        padded = [t + [0] * (width - len(t)) for t in decode_tables]
        dev = self.device
        wanted = sample_rows
        if score_rows:
            # One row list, ascending (the model takes every row in order when it covers them
            # all); sampled and scored rows never overlap: a sampled row's next token is unknown.
            wanted = sorted([*sample_rows, *score_rows])

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=dev)

        meta = BatchMeta(
            positions=ints(positions),
            slot_blocks=ints(slot_blocks),
            slot_offsets=ints(slot_offsets),
            num_decode=len(decode_tables),
            decode_block_tables=torch.tensor(padded, dtype=torch.int64, device=dev).view(
                len(padded), width
            ),
            decode_context_lens=ints(decode_lens),
            prefills=prefills,
            sample_rows=ints(wanted),
        )
        if self.threads is not None:  # cheap (0.2 us): set per step, no state to restore
            small, large = self.threads
            torch.set_num_threads(large if len(tokens) >= PARALLEL_STEP_TOKENS else small)
        graphs = self._graphs
        if (
            graphs
            and not prefills
            and len(sample_rows) == len(tokens)
            and graphs.fits(len(tokens), width)
        ):
            logits = graphs.run(ints(tokens), meta)
        else:
            logits = self.model.forward(ints(tokens), meta, self.kv_cache)
        if wants_logprobs:
            self._score_spans = score_spans
            if score_rows:
                at = {r: j for j, r in enumerate(wanted)}
                self._score_logits = logits[[at[r] for r in score_rows]]
                logits = logits[[at[r] for r in sample_rows]]
            else:
                self._score_logits = logits[:0]
        return logits, sampled_inputs

    @torch.inference_mode()
    def score(self, token_ids: list[int], block_table: list[int] | None = None) -> torch.Tensor:
        """fp32 next-token logits at every position of ``token_ids`` (``[n, vocab]``).

        Teacher-forced scoring for quality checks (a quantization against its reference);
        uses ``block_table`` (default: the first blocks of the cache) as scratch KV space.
        """
        n = len(token_ids)
        if block_table is None:
            block_table = list(range(-(-n // self.block_size)))
        step = StepInput(-1, list(token_ids), 0, block_table, True, SamplingParams())
        self._check(step, n)
        bs = self.block_size
        dev = self.device
        meta = BatchMeta(
            positions=torch.arange(n, device=dev),
            slot_blocks=torch.tensor([block_table[p // bs] for p in range(n)], device=dev),
            slot_offsets=torch.arange(n, device=dev) % bs,
            num_decode=0,
            decode_block_tables=torch.zeros((0, 0), dtype=torch.int64, device=dev),
            decode_context_lens=torch.zeros(0, dtype=torch.int64, device=dev),
            prefills=[PrefillChunk(0, n, 0, torch.tensor(block_table, device=dev))],
            sample_rows=torch.arange(n, device=dev),
        )
        return self.model.forward(torch.tensor(token_ids, device=dev), meta, self.kv_cache)

    @staticmethod
    def _is_decode(step: StepInput) -> bool:
        return len(step.token_ids) == 1 and step.start_pos > 0

    def _check(self, step: StepInput, end: int) -> None:
        if not step.token_ids:
            raise ValueError(f"StepInput seq_id={step.seq_id} has no token_ids")
        if end > self.config.max_position_embeddings:
            raise ValueError(
                f"seq_id={step.seq_id} reaches position {end}, beyond the model's "
                f"max_position_embeddings={self.config.max_position_embeddings}"
            )
        if len(step.block_table) * self.block_size < end:
            raise ValueError(
                f"seq_id={step.seq_id}: block_table has {len(step.block_table)} blocks of "
                f"{self.block_size}, too few for {end} positions"
            )
        # The native attention kernel reads blocks by id without bounds checks.
        if min(step.block_table) < 0 or max(step.block_table) >= self.num_kv_blocks:
            raise ValueError(
                f"seq_id={step.seq_id}: block_table holds block ids outside "
                f"[0, {self.num_kv_blocks}): {step.block_table}"
            )

    def _sample(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        batch: list[StepInput],
        sampled_inputs: list[int],
    ) -> list[int]:
        greedy = logits.argmax(dim=-1).tolist()
        out: list[int] = []
        for row, (p, i) in enumerate(zip(params, sampled_inputs, strict=True)):
            if p.temperature <= 0.0:
                out.append(int(greedy[row]))
                continue
            step = batch[i]
            gen = self._generator
            if p.seed is not None:
                position = step.start_pos + len(step.token_ids)
                gen = torch.Generator(device="cpu").manual_seed(p.seed * 1_000_003 + position)
            probs = torch.softmax(logits[row].cpu() / p.temperature, dim=-1)
            if p.top_p < 1.0:
                sorted_p, idx = probs.sort(descending=True)
                keep = sorted_p.cumsum(0) - sorted_p < p.top_p  # always keeps the top token
                probs = torch.zeros_like(probs).scatter_(0, idx[keep], sorted_p[keep])
            out.append(int(torch.multinomial(probs, 1, generator=gen).item()))
        return out


def _logprob_rows(
    logits: torch.Tensor, token_ids: list[int], first_position: int, k: int
) -> list[TokenLogprob]:
    """Per row: the log-probability of ``token_ids[row]`` and the ``k`` most likely tokens."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(1, torch.tensor(token_ids, device=logp.device).view(-1, 1)).view(-1)
    top_v, top_i = logp.topk(min(k, logp.shape[-1]), dim=-1) if k else (logp[:, :0],) * 2
    chosen_l, vals, ids = chosen.tolist(), top_v.tolist(), top_i.tolist()
    return [
        TokenLogprob(
            first_position + r, token_ids[r], chosen_l[r], list(zip(ids[r], vals[r], strict=True))
        )
        for r in range(len(token_ids))
    ]
