"""``lowbit.quant.block_clipping``: clipped blocks, underflowing scales and flushed values per
FP4 scale rule, on hand-made blocks whose counts are known exactly."""

from __future__ import annotations

import numpy as np
import pytest

from lowbit.errors import LowbitError
from lowbit.quant.block_clipping import (
    FP4_SCALE_RULES,
    NO_TENSOR_SCALE,
    block_counts,
    fp4_block_counts,
)


def _mx_blocks() -> np.ndarray:
    """Five MXFP4 blocks of 32 (the rest of each block zeros):
    A: amax 6 (significand 1.5: no rule clips), 0.25 (a tie to code 0) and 0.2 flush under
       scale 1, 0.3 does not;
    B: amax 7 (significand 1.75): floor clips, carry/ceil/ct take scale 2; 0.2 flushes under
       every rule, 0.4 only under scale 2;
    C: amax 6.5 (1.625): floor, carry and ct clip, ceil takes scale 2;
    D: all zero;
    E: one value 2**-140: the shared exponent wants 2**-142, below E8M0's 2**-127: it flushes.
    """
    x = np.zeros((5, 32), dtype=np.float32)
    x[0, :4] = [6.0, 0.25, -0.2, 0.3]
    x[1, :3] = [-7.0, 0.2, 0.4]
    x[2, 0] = 6.5
    x[4, 7] = np.float32(2.0**-140)
    return x


@pytest.mark.parametrize(
    ("rule", "clipped", "flushed"),
    [("mxfp4", 2, 4), ("mxfp4:carry", 1, 5), ("mxfp4:ceil", 0, 5), ("mxfp4:ct", 1, 5)],
)
def test_mxfp4_rules(rule: str, clipped: int, flushed: int) -> None:
    """Each E8M0 rule's clipped blocks and flushed values on the hand-made blocks."""
    c = block_counts(_mx_blocks(), rule)
    assert (c.block, c.blocks, c.nonzero_blocks, c.values, c.nonzero_values) == (32, 5, 4, 160, 9)
    assert (c.clipped, c.scale_underflow, c.flushed) == (clipped, 1, flushed)


def _nv_blocks() -> np.ndarray:
    """Four NVFP4 blocks of 16; the tensor's amax 8 makes the tensor scale g = 2688/8 = 336
    exactly.
    1: amax 8 (block scale 448, what the codes multiply 4/3): 0.3 flushes (<= 1/3), 0.5 does
       not; without the tensor scale the E4M3 scale of 8/6 is 1.375: the same;
    2: one value 2**-20: g·amax/6 ≈ 5e-5, below E4M3's 2**-9 either way: it flushes;
    3: amax 0.01 (a typical weight): with g the scale is 0.5625/336, 0.00045 stays; without it
       amax/6 ≈ 0.00167 is below 2**-9, stored as 2**-9, and 0.00045 (<= 2**-11) flushes;
    4: amax with g·amax/6 = 0.53, stored 0.5 (E4M3 rounds down): the block clips; without
       g the scale rounds up to 2**-9 (an underflow, no clipping).
    """
    x = np.zeros((4, 16), dtype=np.float32)
    x[0, :3] = [8.0, 0.5, -0.3]
    x[1, 3] = np.float32(2.0**-20)
    x[2, :2] = [-0.01, 0.00045]
    x[3, 5] = np.float32(0.53 * 6 / 336)
    return x


@pytest.mark.parametrize(
    ("rule", "clipped", "under", "flushed"), [("nvfp4", 1, 1, 2), (NO_TENSOR_SCALE, 0, 3, 3)]
)
def test_nvfp4_with_and_without_tensor_scale(
    rule: str, clipped: int, under: int, flushed: int
) -> None:
    """NVFP4's counts with its tensor scale and without it."""
    c = block_counts(_nv_blocks(), rule)
    assert (c.block, c.blocks, c.nonzero_blocks, c.nonzero_values) == (16, 4, 4, 7)
    assert (c.clipped, c.scale_underflow, c.flushed) == (clipped, under, flushed)


def test_counts_match_quantize() -> None:
    """On random heavy-tailed weights, the flushed values are those lowbit.quantize codes as
    zero; RCEIL never clips, carry and ct clip alike on FP4 and less than floor."""
    import lowbit
    from lowbit.quant.scheme_text import parse_scheme

    rng = np.random.default_rng(0)
    x = (rng.standard_t(3, size=(16, 256)) * 0.02).astype(np.float32)
    clipped = {}
    for rule in ("mxfp4", "mxfp4:carry", "mxfp4:ceil", "mxfp4:ct", "nvfp4"):
        c = block_counts(x, rule)
        d = lowbit.quantize(x, parse_scheme(rule)).dequantize(np.float32)
        assert c.flushed == int(np.count_nonzero((x != 0) & (d == 0))), rule
        clipped[rule] = c.clipped
    assert clipped["mxfp4"] > clipped["mxfp4:carry"] == clipped["mxfp4:ct"] > 0
    assert clipped["mxfp4:ceil"] == 0


def test_all_rules_and_bad_input() -> None:
    """fp4_block_counts gives every rule whose block fits; bad rules and shapes are errors."""
    x = _mx_blocks()
    assert [c.rule for c in fp4_block_counts(x)] == list(FP4_SCALE_RULES)
    assert [c.rule for c in fp4_block_counts(np.ones((2, 48)))] == ["nvfp4", NO_TENSOR_SCALE]
    assert fp4_block_counts(x)[0].to_dict()["clipped"] == 2
    with pytest.raises(LowbitError, match="not a block-scaled FP4"):
        block_counts(x, "int4:g32")
    with pytest.raises(LowbitError, match="do not divide"):
        block_counts(np.ones((2, 48)), "mxfp4")
    with pytest.raises(LowbitError, match="non-finite"):
        block_counts(np.full((1, 32), np.inf), "mxfp4")
