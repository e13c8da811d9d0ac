"""FlexAttention over packed rows, the CUDA training path (`rlmlab.attention.backends.backend`
builds it for "flex"): one attention call per layer for the whole batch, its block tables built
on the host from the `Layout` alone. CPU training never takes this path (torch 2.13 has no CPU
backward for FlexAttention); docs/gpu.md says how it was checked on a GPU."""

from __future__ import annotations

import numpy as np
import torch

from rlmlab.attention.layout import Backend, Layout, to_device, visible

FLEX_BLOCK = 128  # FlexAttention's tile: the block tables say which tiles to compute


class Flex(Backend):
    """Packed rows for FlexAttention: one attention call per layer for the whole batch.

    Positions outside every segment (row padding) attend causally among themselves, so no query
    row is empty; their outputs are never read.

    The block tables are built here, on the host, from the layout alone. A segment occupies a
    contiguous span, so the key tiles a query tile needs run from the tile holding the start of
    its first position's segment up to the diagonal; a tile strictly below the diagonal whose
    keys and queries all lie in one segment (and no lane rule applies) is full: the kernel skips
    the mask there. The exact rule per pair is the kernel's `mask_mod` (`block_mask`).
    """

    def __init__(self, layout: Layout, block: int = FLEX_BLOCK):
        from torch.nn.attention.flex_attention import BlockMask

        B, T = layout.shape
        seg = layout.seg.cpu().numpy().astype(np.int32)
        t = np.arange(T)
        opens = np.ones((B, T), dtype=bool)
        opens[:, 1:] = seg[:, 1:] != seg[:, :-1]
        run_start = np.maximum.accumulate(np.where(opens, t, 0), axis=1)  # (B, T) start of each position's span
        nb = -(-T // block)
        first = run_start[:, ::block]  # (B, nb) span start of each query tile's first position
        last = run_start[:, np.minimum(np.arange(nb) * block + block - 1, T - 1)]  # ... of its last position
        i, j = np.arange(nb)[:, None], np.arange(nb)[None, :]
        lo = (first // block)[:, :, None]  # first key tile needed
        full_from = np.minimum(-(-last // block), np.arange(nb))[:, :, None]  # first tile wholly in the span
        if layout.frame is not None:
            full_from = np.broadcast_to(i, full_from.shape)  # the lane rule: no tile is known full
        partial = ((j >= lo) & (j < full_from)) | (j == i)  # (B, nb, nb)
        full = (j >= full_from) & (j < i)

        def ordered(m: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
            count = m.sum(-1).astype(np.int32)[:, None]
            index = np.argsort(~m, axis=-1, kind="stable").astype(np.int32)[:, None]  # allowed tiles first
            return canonical(count), canonical(index)

        self.tables = BlockMask.from_kv_blocks(*ordered(partial), *ordered(full), BLOCK_SIZE=block,
                                               seq_lengths=(T, T))
        self.seg = torch.from_numpy(seg)
        self.frame = None if layout.frame is None else layout.frame.to(torch.int32)
        self.branch = None if layout.branch is None else layout.branch.to(torch.int32)

    def to(self, device) -> "Flex":
        """Tables and ids moved once (from pinned memory on CUDA)."""
        device = torch.device(device)
        if self.seg.device == device:
            return self
        from torch.nn.attention.flex_attention import BlockMask

        tb = self.tables
        tables = BlockMask(seq_lengths=tb.seq_lengths, BLOCK_SIZE=tb.BLOCK_SIZE, mask_mod=tb.mask_mod,
                           **{a: to_device(getattr(tb, a), device) for a in BlockMask._TENSOR_ATTRS})
        return self._with(tables=tables, **{a: to_device(getattr(self, a), device) for a in ("seg", "frame", "branch")})

    def block_mask(self):
        """The `BlockMask` of this batch: the block tables, and the exact rule per pair."""
        seg, frame, branch = self.seg, self.frame, self.branch
        if frame is None:
            def mask_mod(b, h, q, k):
                return visible(q, k, seg[b, q], seg[b, k])
        else:
            def mask_mod(b, h, q, k):
                return visible(q, k, seg[b, q], seg[b, k], frame[b, q], frame[b, k], branch[b, q], branch[b, k])
        tb = self.tables
        return type(tb)(seq_lengths=tb.seq_lengths, BLOCK_SIZE=tb.BLOCK_SIZE, mask_mod=mask_mod,
                        **{a: getattr(tb, a) for a in tb._TENSOR_ATTRS})

    def bind(self, positions) -> "_FlexCall":
        if positions.biases:  # FlexAttention would need ALiBi as a score_mod
            raise ValueError("ALiBi has no FlexAttention path: train it with the blocks attention")
        return _FlexCall(self.block_mask())


class _FlexCall:
    """A `Flex` bound to one forward pass: its `BlockMask`, built once for every layer."""

    def __init__(self, block_mask):
        self.block_mask = block_mask

    def attend(self, q, k, v, layer: int = 0, dropout_p: float = 0.0) -> torch.Tensor:
        if dropout_p:
            raise ValueError("FlexAttention applies no attention dropout: use the blocks attention")
        return flex_attend(q, k, v, self.block_mask)


def flex_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask) -> torch.Tensor:
    """FlexAttention over (B, nh, T, hs). Outside a compiled model it runs through a compiled
    kernel of its own: the eager form materialises every score."""
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling() or q.device.type != "cuda":
        return flex_attention(q, k, v, block_mask=block_mask)
    return _compiled_flex()(q, k, v, block_mask=block_mask)


_COMPILED_FLEX = []


def _compiled_flex():
    if not _COMPILED_FLEX:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX.append(torch.compile(flex_attention, dynamic=False))
    return _COMPILED_FLEX[0]


def canonical(a: np.ndarray) -> torch.Tensor:
    """`a` as a tensor with the row-major strides of its shape, size-1 dimensions included.

    The compiled FlexAttention kernels index the block tables as if they had those strides.
    numpy gives a sum over a broadcast mask column-major strides and an inserted axis a stride
    of 0; with them the CPU kernel read other tiles' counts, and the CUDA kernel of an H200 read
    the first batch row's tables for every row (docs/gpu.md)."""
    return torch.from_numpy(np.asarray(a)).clone(memory_format=torch.contiguous_format)
