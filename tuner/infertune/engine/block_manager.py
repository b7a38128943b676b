"""The paged KV cache's bookkeeping: a pool of fixed-size blocks and per-sequence block tables.

Torch-free on purpose (like nano-vllm's ``block_manager.py``): the runner owns the KV tensors,
this module only decides which physical block ids a sequence's positions map to. Position ``p``
of a sequence lives in block ``table[p // block_size]`` at offset ``p % block_size``.
"""

from __future__ import annotations

from collections import deque

__all__ = ["BlockManager", "OutOfBlocksError"]


class OutOfBlocksError(RuntimeError):
    """Raised by :meth:`BlockManager.ensure` when the free list cannot cover a request."""


class BlockManager:
    """A free list of ``num_blocks`` blocks of ``block_size`` token slots each."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks={num_blocks} must be a positive integer")
        if block_size < 1:
            raise ValueError(f"block_size={block_size} must be a positive integer")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # FIFO reuse spreads writes over the pool; any order would be correct.
        self._free: deque[int] = deque(range(num_blocks))
        self._tables: dict[int, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences, in [0, 1] (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self._free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` positions."""
        return -(-num_tokens // self.block_size)

    def block_table(self, seq_id: int) -> list[int]:
        """The physical block ids of ``seq_id`` (empty when it holds none)."""
        return self._tables.get(seq_id, [])

    def has(self, seq_id: int) -> bool:
        return seq_id in self._tables

    def missing_blocks(self, seq_id: int, num_tokens: int) -> int:
        """Blocks ``seq_id`` still lacks to cover positions ``[0, num_tokens)``."""
        return max(0, self.blocks_for(num_tokens) - len(self._tables.get(seq_id, ())))

    def can_allocate(self, seq_id: int, num_tokens: int) -> bool:
        """Whether ``seq_id``'s table can grow to cover ``num_tokens`` positions right now."""
        return self.missing_blocks(seq_id, num_tokens) <= len(self._free)

    def ensure(self, seq_id: int, num_tokens: int) -> list[int]:
        """Grow ``seq_id``'s table to cover ``num_tokens`` positions and return it.

        Allocation is all-or-nothing: on :class:`OutOfBlocksError` the table is unchanged.
        """
        missing = self.missing_blocks(seq_id, num_tokens)
        if missing > len(self._free):
            raise OutOfBlocksError(
                f"seq {seq_id} needs {missing} more KV blocks for {num_tokens} tokens; "
                f"{len(self._free)} of {self.num_blocks} are free"
            )
        table = self._tables.setdefault(seq_id, [])
        for _ in range(missing):
            table.append(self._free.popleft())
        return table

    def free(self, seq_id: int) -> int:
        """Return every block of ``seq_id`` to the pool; the number of blocks released."""
        table = self._tables.pop(seq_id, [])
        self._free.extend(table)
        return len(table)
