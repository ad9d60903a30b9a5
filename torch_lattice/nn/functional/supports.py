"""The supports a convolution or pooling generates, built here.

- Strided (``generated_support``): the output support of ``conv3d`` / pooling without a
  target, every reachable ``q`` in ``[0, R_out)`` sorted by (b, x, y, z).
- Generative (``generative_support``): ``unique{src * stride + r}`` of a generative
  transpose, never clipped.
- Transposed without a target (``generated_transposed_support``), the artifact
  contract's generated route of pooling transposes and trilinear upsampling: every
  ``src[i] * stride + r * dilation - padding`` over every row and kernel position,
  deduplicated and sorted by ``(b, x, y, z)`` (the order ``torch.unique(dim=0)`` gives,
  as torch-lattice 0.5 does).  Our coordinates are non-negative, so a candidate below 0
  (or beyond int32) is an error, never dropped: the caller passes a ``target`` instead.

The first two are cached in the source's coordinate manager (built once per source and
geometry); the manager records each strided derivation, so a transpose without a
target finds its way back (``cached_source_support``).
"""

from __future__ import annotations

import torch

from torch_lattice.coord_rows import unique_rows
from torch_lattice.geometry import ConvGeometry, kernel_positions
from torch_lattice.memory_budget import check_allocation
from torch_lattice.ops import kmap as km
from torch_lattice.tensor import SparseTensor, Support, divide_stride, multiply_stride

__all__ = [
    "cached_source_support",
    "generated_support",
    "generated_transposed_support",
    "generative_support",
]

_INT32_MAX = 2**31 - 1
# Output coordinates are int32: an output range may be at most 2^31 per axis.
_COORD_LIMIT = 2**31


def generated_support(source: Support, geometry: ConvGeometry) -> Support:
    """The support a strided convolution (or pooling) with ``geometry`` generates
    from ``source`` (cached in its coordinate manager).

    Raises:
        ValueError: the window does not fit the input range (``R_out < 1``), as
            for ``torch.nn.Conv3d``; an empty tensor without a range is allowed.
            Or the output range exceeds 2^31 on some axis (padding past int32), or
            ``source``'s rows were edited in place after it was made.
    """
    out_range = geometry.output_range(source.grid_range())
    if min(out_range) < 1 and (source.num_rows or source.spatial_range is not None):
        raise ValueError(
            f"kernel_size {geometry.kernel_size} with dilation {geometry.dilation} and padding "
            f"{geometry.padding} does not fit the input range {source.grid_range()}: "
            f"output range would be {out_range}"
        )
    for axis, r in enumerate(out_range):
        if r > _COORD_LIMIT:
            raise ValueError(
                f"padding {geometry.padding} on the input range {source.grid_range()} "
                f"(spatial_range {source.spatial_range}) gives an output range {out_range} "
                f"whose axis {'xyz'[axis]} exceeds 2^31: output coordinates must fit int32; "
                "use less padding or a smaller spatial_range"
            )
    manager = source.manager

    def build() -> Support:
        if source.num_rows == 0:
            coords = source.coords.new_empty((0, 4))
        else:
            coords = km.generate_support(
                source.coords, *map(list, geometry.as_c()), list(out_range),
                source.num_batches(),
            )
        stride = multiply_stride(source.stride, geometry.stride)
        srange = None
        if source.spatial_range is not None:
            srange = (source.spatial_range[0], *out_range)
        out = manager.new_support(coords, stride, srange,  # type: ignore[arg-type]
                                  stable=manager.is_stable(source))
        manager.record_derivation(out, source, geometry)
        return out

    return manager.cached("generated", (source, geometry), (source,), build)


def generative_support(source: Support, geometry: ConvGeometry) -> Support:
    """Output support of a generative transpose of ``source`` (cached in its manager).

    ``unique{source * stride + r}`` sorted by (b, x, y, z), stride
    ``source.stride / stride``, range ``(R - 1) * stride + K`` when the
    source has one.

    Raises:
        ValueError: a generated coordinate would leave int32, the candidates would
            exceed the memory budget, or ``source``'s rows were edited in place.
    """
    manager = source.manager

    def build() -> Support:
        stride = divide_stride(source.stride, geometry.stride)
        if source.num_rows:
            for axis, (r, s, k) in enumerate(
                zip(source.grid_range(), geometry.stride, geometry.kernel_size, strict=True)
            ):
                top = (r - 1) * s + k - 1
                if top > _INT32_MAX:
                    raise ValueError(
                        f"GenerativeConvTranspose3d with stride {geometry.stride} and "
                        f"kernel_size {geometry.kernel_size} maps coordinate {r - 1} on axis "
                        f"{'xyz'[axis]} to {top}, beyond the int32 limit {_INT32_MAX}"
                    )
        k = geometry.kernel_size[0] * geometry.kernel_size[1] * geometry.kernel_size[2]
        # Every (row, kernel position) candidate is materialised (int32 x 4) before unique.
        check_allocation(
            f"generative transpose support ({source.num_rows} rows x {k} kernel positions)",
            source.num_rows * k * 16,
        )
        coords = km.generative_support(
            source.coords, list(geometry.kernel_size), list(geometry.stride)
        )
        srange = None
        if source.spatial_range is not None:
            b, *r = source.spatial_range
            ext = [
                (ri - 1) * s + k
                for ri, s, k in zip(r, geometry.stride, geometry.kernel_size, strict=True)
            ]
            srange = (b, ext[0], ext[1], ext[2])
        return manager.new_support(coords, stride, srange, stable=manager.is_stable(source))

    return manager.cached("generative", (source, geometry), (source,), build)


def cached_source_support(src: SparseTensor, geometry: ConvGeometry) -> Support | None:
    """The input support of the pooling / Conv3d with ``geometry`` that produced
    ``src``, or None when none is in ``src``'s history.

    Raises:
        ValueError: such layers produced ``src``'s support from more than one input
            support (it was also a target: ``down(x1, coordinates=a)``), so which one
            to return to is ambiguous; the most recent would silently be another
            source's rows.
    """
    found = [d for d in src.coordinate_manager.derivations(src.support) if d.geometry == geometry]
    sources = list({id(d.source): d.source for d in found}.values())
    if len(sources) > 1:
        raise ValueError(
            f"ConvTranspose3d(src) without a target: src's support was produced by "
            f"{len(sources)} Conv3d/pooling calls with this geometry (kernel_size="
            f"{geometry.kernel_size}, stride={geometry.stride}) from different input "
            "supports (src's coordinates were also used as a target), so which one to "
            "return to is ambiguous; pass the target coordinates explicitly: up(src, target)"
        )
    return sources[0] if sources else None


def generated_transposed_support(src: SparseTensor, geometry: ConvGeometry, op: str) -> Support:
    """``unique{src[i] * s + r * d - p}`` sorted by (b, x, y, z), stride ``src.stride / s``.

    The range, when ``src`` has one, is ``(R - 1) * s + (K - 1) * d - p + 1`` per axis
    (one past the largest coordinate any row of the range can generate).

    Raises:
        ValueError: a generated coordinate would be negative or beyond int32, the range
            beyond 2^31, or the input stride is not divisible by ``stride``.
    """
    stride = divide_stride(src.stride, geometry.stride)
    coords = src.coords
    device = coords.device
    k = geometry.kernel_size[0] * geometry.kernel_size[1] * geometry.kernel_size[2]
    # int64 candidates (spatial, batch and their concatenation) before unique.
    check_allocation(
        f"{op} without a target ({coords.shape[0]} rows x {k} kernel positions generated)",
        int(coords.shape[0]) * k * 8 * 10,
    )
    s = torch.tensor(geometry.stride, dtype=torch.int64, device=device)
    d = torch.tensor(geometry.dilation, dtype=torch.int64, device=device)
    p = torch.tensor(geometry.padding, dtype=torch.int64, device=device)
    offsets = kernel_positions(geometry.kernel_size).to(device=device, dtype=torch.int64) * d - p
    spatial = coords[:, None, 1:].long() * s + offsets[None]
    batch = coords[:, None, :1].long().expand(-1, offsets.shape[0], -1)
    candidates = torch.cat((batch, spatial), dim=2).reshape(-1, 4)
    if candidates.shape[0]:
        lo, hi = int(spatial.min()), int(spatial.max())
        if lo < 0:
            raise ValueError(
                f"{op} without a target generates coordinate {lo} < 0 (input rows * stride "
                f"{geometry.stride} + kernel offsets - padding {geometry.padding}); coordinates "
                "must be non-negative, so pass the fine support explicitly: target=..."
            )
        if hi > _INT32_MAX:
            raise ValueError(
                f"{op} without a target generates coordinate {hi}, beyond the int32 limit "
                f"{_INT32_MAX}"
            )
    out = unique_rows(candidates)[0].to(torch.int32)
    srange = None
    if src.spatial_range is not None:
        b, *r = src.spatial_range
        ext = [
            (ri - 1) * si + (k - 1) * di - pi + 1
            for ri, si, k, di, pi in zip(
                r,
                geometry.stride,
                geometry.kernel_size,
                geometry.dilation,
                geometry.padding,
                strict=True,
            )
        ]
        if min(ext) < 1:
            raise ValueError(
                f"{op}: padding {geometry.padding} leaves no room in the generated range {ext} "
                f"of the input range {src.spatial_range}; pass target=..."
            )
        if max(ext) > _INT32_MAX + 1:
            # A SparseTensor's range counts int32 coordinates from 0: at most 2^31.
            axis = max(range(3), key=ext.__getitem__)
            raise ValueError(
                f"{op} without a target: the input's spatial_range {src.spatial_range} with "
                f"stride {geometry.stride}, kernel_size {geometry.kernel_size}, dilation "
                f"{geometry.dilation} and padding {geometry.padding} gives a generated range "
                f"{tuple(ext)} whose axis {'xyz'[axis]} exceeds 2^31 (coordinates are int32); "
                "use a smaller spatial_range or pass target=..."
            )
        srange = (b, ext[0], ext[1], ext[2])
    generated = src.coordinate_manager.new_support(out.contiguous(), stride, srange)
    # A transpose onto it (replay's no-target conv_transpose3d) may then run over pair
    # lists instead of the (N_out, K) table.
    src.coordinate_manager.record_expansion(generated, src.support, geometry)
    return generated
