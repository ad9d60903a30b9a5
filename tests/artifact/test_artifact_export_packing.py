"""Affine int4/int8 packing of artifact weights: bit layout, shapes, round trip, refusals.

Per group of ``group_size`` input channels (rows zero-padded):
``scale = (min - max) / qmax``, ``bias = max``,
``code = clamp(round((w - bias) / scale), 0, qmax)``; code ``i`` of a uint32 word
sits at bit ``bits * i``.  Stored ``(K, words, O)`` for K > 1, ``(1, O, words)``
for K = 1, scales and biases (float32 by default, float16 on request) in the same
arrangement. Group sizes are 32, 64 or 128, the sizes MLX Lattice runs.
"""

from __future__ import annotations

import pytest
import torch

from torch_lattice.artifact.packing import pack_weight, unpack_weight


def _padded(values: list[float], width: int) -> list[float]:
    """``values`` then copies of its first value: a group whose min and max are ``values``'."""
    return values + [values[0]] * (width - len(values))


def test_int4_bit_layout_by_hand() -> None:
    # max 0, min -15: scale -1, bias 0, so code = -w.
    w = torch.tensor([_padded([-15.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, -6.0], 32)])
    packed = pack_weight(w, bits=4, group_size=32, scale_dtype=torch.float16)
    assert packed.weight.dtype == torch.uint32
    assert packed.weight.shape == (1, 1, 4)  # (1, O, words): 32 codes in 4 words
    assert int(packed.weight[0, 0, 0]) == 0x6543210F
    assert packed.scales.dtype == torch.float16 and float(packed.scales[0, 0, 0]) == -1.0
    assert float(packed.biases[0, 0, 0]) == 0.0
    assert torch.equal(unpack_weight(*packed.astuple(), bits=4, group_size=32), w)


def test_int8_bit_layout_by_hand() -> None:
    w = torch.tensor([_padded([-255.0, 0.0, -1.0, -2.0], 64), [4.0] * 64])
    packed = pack_weight(w, bits=8, group_size=64)
    assert packed.weight.shape == (1, 2, 16)  # (1, O, words)
    assert int(packed.weight[0, 0, 0]) == 0x020100FF
    # float32 scales by default (a float32 graph)
    assert packed.scales.dtype == torch.float32 and float(packed.scales[0, 0, 0]) == -1.0
    # A constant group has scale 0: every code 0, the value is the bias.
    assert int(packed.weight[0, 1, 0]) == 0 and float(packed.scales[0, 1, 0]) == 0.0
    assert torch.equal(unpack_weight(*packed.astuple(), bits=8, group_size=64), w)


def test_rows_are_zero_padded_to_whole_groups() -> None:
    w = torch.tensor([[1.0, 2.0, 3.0]])
    packed = pack_weight(w, bits=4, group_size=32)  # 29 zero channels join the group
    assert float(packed.biases[0, 0, 0]) == 3.0
    assert float(packed.scales[0, 0, 0]) == pytest.approx(-3.0 / 15, rel=1e-6)
    padded = unpack_weight(*packed.astuple(), bits=4, group_size=32)
    assert padded.shape == (1, 32)
    assert padded[0, 3:].abs().max() < 0.11  # the padding decodes to about 0
    trimmed = unpack_weight(*packed.astuple(), bits=4, group_size=32, in_channels=3)
    assert trimmed.shape == (1, 3)


@pytest.mark.parametrize("bits", [4, 8])
def test_conv_shapes_and_round_trip(bits: int) -> None:
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 3, 2, 1, 40, generator=g)  # (O, Kx, Ky, Kz, I), K = 6
    packed = pack_weight(w, bits=bits)
    words = 64 * bits // 32  # 40 channels padded to 64
    assert packed.weight.shape == (6, words, 5)
    assert packed.scales.shape == packed.biases.shape == (6, 2, 5)
    back = unpack_weight(*packed.astuple(), bits=bits, in_channels=40, kernel_size=(3, 2, 1))
    assert back.shape == w.shape
    # Within half a step of each group's scale (plus float16 rounding of scale and bias).
    scale = packed.scales.float().abs().amax().item()
    assert (back - w).abs().max().item() <= 0.5 * scale * 1.02 + 4e-3
    # Kernel row k = (rx*Ky + ry)*Kz + rz, output o: group 0 of that row at [k, :, o].
    k, o = 4, 3  # position (2, 0, 0)
    lanes = 32 // bits
    first = int(packed.weight[k, 0, o])
    codes = [(first >> (bits * i)) & ((1 << bits) - 1) for i in range(lanes)]
    s, b = float(packed.scales[k, 0, o]), float(packed.biases[k, 0, o])
    torch.testing.assert_close(
        torch.tensor([c * s + b for c in codes]), back[o, 2, 0, 0, :lanes], rtol=0, atol=1e-6
    )


def test_linear_round_trip_is_within_quantization_error() -> None:
    g = torch.Generator().manual_seed(1)
    w = torch.randn(7, 70, generator=g)
    for bits, tol in ((4, 0.5), (8, 0.03)):
        packed = pack_weight(w, bits=bits, group_size=32)
        assert packed.weight.shape == (1, 7, 96 * bits // 32)
        back = unpack_weight(*packed.astuple(), bits=bits, group_size=32, in_channels=70)
        assert 0 < (back - w).abs().max().item() < tol


@pytest.mark.parametrize("group_size", [1, 8, 16, 48, 256, 2**62])
def test_group_sizes_the_consumer_does_not_run_are_refused(group_size: int) -> None:
    with pytest.raises(ValueError, match="quantize_group_size must be 32, 64 or 128"):
        pack_weight(torch.randn(2, 8), bits=4, group_size=group_size)


def test_refusals() -> None:
    w = torch.randn(2, 8)
    with pytest.raises(ValueError, match="quantize_bits"):
        pack_weight(w, bits=2)
    with pytest.raises(TypeError, match="floating"):
        pack_weight(torch.ones(2, 8, dtype=torch.int32), bits=4)
    with pytest.raises(ValueError, match="finite"):
        pack_weight(torch.tensor([[float("nan")] * 8]), bits=4, group_size=32)
    with pytest.raises(ValueError, match="scale_dtype"):
        pack_weight(w, bits=4, scale_dtype=torch.bfloat16)
    # Finite weights whose scale is not: a group's range past float32's largest value, a
    # scale or bias past float16's (it was stored as inf, and replay gave NaN).
    wide = torch.zeros(2, 32)
    wide[0, :2] = torch.tensor([1.8e38, -1.8e38])
    with pytest.raises(ValueError, match=r"a group's scale .* is not finite in torch.float32"):
        pack_weight(wide, bits=4, group_size=32)
    big = torch.full((2, 32), 7e4)
    big[:, 0] = 0.0
    with pytest.raises(ValueError, match=r"a group's bias .* is not finite in torch.float16"):
        pack_weight(big, bits=8, group_size=32, scale_dtype=torch.float16)
    assert pack_weight(big, bits=8, group_size=32).biases.isfinite().all()  # float32 holds it
    with pytest.raises(ValueError, match="conv3d_o_xyz_i"):
        pack_weight(torch.randn(2, 3, 4), bits=4)
    packed = pack_weight(torch.randn(2, 1, 1, 2, 8), bits=8, group_size=32)
    with pytest.raises(ValueError, match="kernel_size"):
        unpack_weight(*packed.astuple(), bits=8, group_size=32)
    with pytest.raises(ValueError, match="rows"):
        unpack_weight(*packed.astuple(), bits=8, group_size=32, kernel_size=(1, 1, 3))
    with pytest.raises(ValueError, match="groups"):
        unpack_weight(*packed.astuple(), bits=8, group_size=64, kernel_size=(1, 1, 2))
    with pytest.raises(ValueError, match="match"):
        unpack_weight(packed.weight, packed.scales[:1], packed.biases, bits=8, group_size=32)
