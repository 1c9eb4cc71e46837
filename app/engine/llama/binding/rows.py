"""An image's embedding rows in the KV cache: where they sit, and the batch that decodes them.

Most projectors give an image chunk one position a row, as text has. M-RoPE models (Qwen2-VL
and its successors) place an image on a grid instead: each row has four positions (time,
row, column, a spare section), every row of the image shares its time position, and the
image advances the sequence by `n_pos` positions (max(nx, ny) for Qwen2-VL), fewer than it
has rows. libmtmd says where each row goes (mtmd_image_tokens_get_decoder_pos); `Layout`
keeps that, read once as the prompt is tokenized, since the chunk's pixels are freed once it
is encoded. A slot then counts positions and KV cells apart: `Seq.pos` is the next
position, `Seq.shift` the cells beyond it (slots.py).

`RowBatch` decodes the rows of several slots' images into their sequences in one
llama_decode (a batch holds tokens or embedding rows, not both, so images and text take
separate decodes); with M-RoPE its positions are section-major, as llama.cpp reads them.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import llama_cpp as lc
import numpy as np
from llama_cpp import mtmd_cpp as mtmd

#: Positions a row has under M-RoPE (llama.cpp's n_pos_per_embd for those models).
MROPE_SECTIONS = 4


@dataclass(frozen=True, eq=False)
class Layout:
    """Where an image chunk's rows go under M-RoPE, from a first position `pos_0`: section
    `j` of row `i` is `base[j, i] + pos_0 * step[j, i]` (libmtmd's layout, read at pos_0 0
    and 1: most sections move with pos_0, some, such as the spare, do not)."""

    n_pos: int  # positions the chunk advances the sequence by
    base: np.ndarray  # (MROPE_SECTIONS, rows) int32
    step: np.ndarray  # (MROPE_SECTIONS, rows) int32, 0 or 1

    @classmethod
    def of(cls, chunk: Any) -> Layout:
        """The layout of an image chunk (mtmd_input_chunk) of an M-RoPE projector."""
        tokens = mtmd.mtmd_input_chunk_get_tokens_image(chunk)
        n = mtmd.mtmd_image_tokens_get_n_tokens(tokens)
        at = np.zeros((2, MROPE_SECTIONS, n), dtype=np.int64)
        for p0 in (0, 1):
            for i in range(n):
                p = mtmd.mtmd_image_tokens_get_decoder_pos(tokens, p0, i)
                # llama.cpp reads the sections as mtmd's helper writes them: t, y, x, z.
                at[p0, :, i] = (p.t, p.y, p.x, p.z)
        base = at[0].astype(np.int32)
        step = (at[1] - at[0]).astype(np.int32)
        return cls(int(mtmd.mtmd_input_chunk_get_n_pos(chunk)), base, step)

    def at(self, pos_0: int) -> np.ndarray:
        return self.base + pos_0 * self.step


class RowBatch:
    """A llama_batch of embedding rows, for the images of several sequences at once."""

    def __init__(self, n_embd: int) -> None:
        self.n_embd = n_embd
        self.size = 0
        self.batch: Any = None
        self._grid: Any = None  # M-RoPE positions, MROPE_SECTIONS per row (ctypes int32s)

    def decode(
        self, lctx: Any, parts: list[tuple[np.ndarray, int, int, Layout | None]], causal: bool
    ) -> int:
        """Decode each (rows, first position, sequence, layout) of `parts` in one
        llama_decode; returns llama.cpp's code (0: done). The parts have a layout each
        (M-RoPE) or none."""
        n_rows = sum(rows.size // self.n_embd for rows, _, _, _ in parts)
        if n_rows > self.size:
            self.free()
            self.batch = lc.llama_batch_init(n_rows, self.n_embd, 1)
            self._grid = (ctypes.c_int32 * (n_rows * MROPE_SECTIONS))()
            self.size = n_rows
        batch = self.batch
        embd = np.ctypeslib.as_array(batch.embd, shape=(self.size * self.n_embd,))
        mrope = parts[0][3] is not None
        if mrope:
            grid = np.ctypeslib.as_array(self._grid)[: n_rows * MROPE_SECTIONS]
            grid = grid.reshape(MROPE_SECTIONS, n_rows)
        n = 0
        for rows, pos, seq_id, layout in parts:
            k = rows.size // self.n_embd
            embd[n * self.n_embd : (n + k) * self.n_embd] = rows
            if layout is not None:
                grid[:, n : n + k] = layout.at(pos)
            for i in range(k):
                if layout is None:
                    batch.pos[n + i] = pos + i
                batch.n_seq_id[n + i] = 1
                batch.seq_id[n + i][0] = seq_id
                batch.logits[n + i] = False
            n += k
        batch.n_tokens = n
        # The address, not the field: a ctypes pointer read from a struct is a view of it.
        own_pos = ctypes.cast(batch.pos, ctypes.c_void_p).value or 0
        if mrope:  # llama.cpp reads MROPE_SECTIONS positions a row, section-major
            batch.pos = ctypes.cast(self._grid, ctypes.POINTER(lc.llama_pos))
        if not causal:
            lc.llama_set_causal_attn(lctx, False)
        try:
            return int(lc.llama_decode(lctx, batch))
        finally:
            # llama_batch_free frees the batch's own positions.
            batch.pos = ctypes.cast(own_pos, ctypes.POINTER(lc.llama_pos))
            if not causal:
                lc.llama_set_causal_attn(lctx, True)

    def free(self) -> None:
        if self.batch is not None:
            lc.llama_batch_free(self.batch)
            self.batch, self.size, self._grid = None, 0, None
