"""The KV block pool: allocation is exact, all-or-nothing, and never hands a block out twice."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infertune.engine.block_manager import BlockManager, OutOfBlocksError


def test_tables_grow_by_whole_blocks_and_usage_tracks_them() -> None:
    bm = BlockManager(num_blocks=8, block_size=4)
    assert bm.usage == 0.0
    assert bm.ensure(1, 5) == bm.block_table(1)
    assert len(bm.block_table(1)) == 2  # positions 0..4 need two blocks of four
    bm.ensure(1, 8)  # still fits in two blocks
    assert len(bm.block_table(1)) == 2
    bm.ensure(1, 9)
    assert len(bm.block_table(1)) == 3
    assert bm.usage == pytest.approx(3 / 8)
    assert bm.free(1) == 3
    assert bm.usage == 0.0 and bm.block_table(1) == []


def test_exhaustion_is_all_or_nothing() -> None:
    bm = BlockManager(num_blocks=4, block_size=2)
    bm.ensure(1, 6)  # three blocks
    assert not bm.can_allocate(2, 3)  # would need two
    with pytest.raises(OutOfBlocksError, match="needs 2 more KV blocks"):
        bm.ensure(2, 3)
    assert bm.block_table(2) == [] and bm.num_free_blocks == 1
    assert bm.can_allocate(2, 2)


@pytest.mark.parametrize(("blocks", "size"), [(0, 16), (4, 0)])
def test_rejects_empty_pools(blocks: int, size: int) -> None:
    with pytest.raises(ValueError, match="must be a positive integer"):
        BlockManager(blocks, size)


ops = st.lists(
    st.tuples(st.sampled_from(["ensure", "free"]), st.integers(0, 5), st.integers(1, 40)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_no_block_is_ever_shared_or_lost(sequence: list[tuple[str, int, int]]) -> None:
    bm = BlockManager(num_blocks=16, block_size=4)
    sizes: dict[int, int] = {}
    for op, seq, n in sequence:
        if op == "free":
            bm.free(seq)
            sizes.pop(seq, None)
            continue
        try:
            bm.ensure(seq, n)
            sizes[seq] = max(sizes.get(seq, 0), n)
        except OutOfBlocksError:
            pass
        held = [b for s in sizes for b in bm.block_table(s)]
        assert len(held) == len(set(held)), "a block is in two tables"
        assert len(held) + bm.num_free_blocks == 16, "a block leaked"
        for s, size in sizes.items():
            assert len(bm.block_table(s)) * 4 >= size


def test_block_manager_and_scheduler_import_without_torch() -> None:
    import subprocess

    code = (
        "import sys; import infertune.engine.scheduler, infertune.engine.block_manager; "
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
