"""Whether a compiled W4A16 GEMM decodes each 32-bit register of weights under the right block scale.

In the kernel layouts (``kernels/nvfp4_decode.py``, LAYOUT 1 and 2) the decode's inline asm takes the two 16-bit words
of a register under one scale code: right only when the compiler pairs two words of one block of 16 K elements. In the
dot-operand layouts Triton gives most tiles (kWidth 2 on sm_90, 4 on sm_120) a register holds adjacent words, which the
layouts keep in one block; but for some tiles the compiler runs the decode in another layout. Triton 3.8, sm_90,
kernel_wgmma, 16x64x64-w4: a linear layout whose registers pair word slots c and c + 2, of two blocks in that layout
(block b of each 16 word slots is 2b, 2b + 1, 2b + 8, 2b + 9), so half the weights take a neighbour's scale. This reads
the layout of every decode asm op from a compiled kernel's TTGIR and checks each register's pair of words; a layout it
cannot read counts as wrong. Two places ask: every ahead-of-time compile of a tile (``w4a16_tiles``: the tuner refuses
such a tile, CI checks the shipped and heuristic ones) and every kernel the op launches, once per compiled kernel
(``refuse_wrong_pairs``: a config given by hand, a cache from an older tune, another Triton version), which raises
before the op returns anything.
"""

from __future__ import annotations

import itertools
import re

from sglang_glm5.variants import DECODE_REFUSED, DecodeRefused

# The layouts whose decode asm takes one scale code for two words (nvfp4.LAYOUTS: "kernel", "kernel_wgmma").
PAIRED_LAYOUTS = (1, 2)
# The decode asm ops that take scale codes: their PTX turns the code into a scale with one multiply-add.
_SCALED_ASM = re.compile(
    r'tt\.elementwise_inline_asm "[^"]*mad\.lo\.u32[^"]*"[^\n]*?-> tensor<([^,>]*), ([^\n]*?)>(?: loc|$)', re.M
)
_ALIAS = re.compile(r"^(#[\w.]+) = (.*)$", re.M)
_BASES = re.compile(r"(register|lane|warp|block) = \[((?:\[[^\]]*\](?:, )?)*)\]")


def scale_block(word: int, layout: int) -> int:
    """The block of 16 K elements (4 words) that word slot ``word`` of a row belongs to, in ``layout`` (1 or 2)."""
    if layout == 2:  # kernel_wgmma: block b of each 16 slots is 2b, 2b + 1, 2b + 8, 2b + 9
        return word // 16 * 4 + word % 8 // 2
    return word // 4


def _linear_pairs(definition: str, rows: int, cols: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (row, word) coordinates of each register pair (2i, 2i + 1) of a ``#ttg.linear`` layout, over every
    lane and warp: a coordinate is the XOR of the bases of its index's set bits."""
    bases = {name: [tuple(int(v) for v in b.split(",")) for b in re.findall(r"\[(-?\d+, -?\d+)\]", body)]
             for name, body in _BASES.findall(definition)}  # fmt: skip
    registers, others = bases.get("register", []), bases.get("lane", []) + bases.get("warp", [])
    if not registers or 2 ** (len(registers) + len(others)) < rows * cols:
        raise ValueError(f"unread linear layout: {definition}")

    def coordinate(bits: list[tuple[int, int]]) -> tuple[int, int]:
        row = col = 0
        for r, c in bits:
            row, col = row ^ r, col ^ c
        if not (0 <= row < rows and 0 <= col < cols):
            raise ValueError(f"a linear layout's coordinate ({row}, {col}) outside [{rows}, {cols}]: {definition}")
        return row, col

    pairs = []
    for other in itertools.product((0, 1), repeat=len(others)):
        fixed = [b for b, on in zip(others, other, strict=True) if on]
        for high in itertools.product((0, 1), repeat=len(registers) - 1):
            rest = [b for b, on in zip(registers[1:], high, strict=True) if on]
            first = coordinate(fixed + rest)
            second = coordinate(fixed + rest + registers[:1])
            pairs.append((first, second))
    return pairs


def wrong_pairs(ttgir: str, layout: int) -> str | None:
    """None when every decode asm op of a compiled GEMM (weights in ``layout``, an index into nvfp4.LAYOUTS) takes
    each register's two words from one scale block; else what it found. Layouts whose asm applies a scale per word
    (the checkpoint's) need no check."""
    if layout not in PAIRED_LAYOUTS:
        return None
    aliases = dict(_ALIAS.findall(ttgir))
    found = 0
    for shape, name in _SCALED_ASM.findall(ttgir):
        found += 1
        definition = aliases.get(name, name)
        dims = shape.split("x")[:-1]  # "64x16xbf16": rows, words
        if len(dims) != 2 or not all(d.isdigit() for d in dims):
            return f"the decode runs on a tensor of shape {shape}, not [rows, words]"
        rows, cols = int(dims[0]), int(dims[1])
        if definition.startswith("#ttg.dot_op"):
            width = re.search(r"kWidth = (\d+)", definition)
            if re.search(r"opIdx = 0", definition) and width and int(width.group(1)) % 2 == 0:
                continue  # each register holds two adjacent words, the first even: one block in both layouts
            return f"the decode runs in {definition}"
        if not definition.startswith("#ttg.linear"):
            return f"the decode runs in a layout this check does not read: {definition}"
        try:
            pairs = _linear_pairs(definition, rows, cols)
        except ValueError as e:
            return str(e)
        for (row_a, col_a), (row_b, col_b) in pairs:
            if row_a != row_b or scale_block(col_a, layout) != scale_block(col_b, layout):
                return f"a register pairs words {col_a} and {col_b} of two scale blocks ({definition})"
    return None if found else "no decode asm op found in the TTGIR"


_CHECKED: dict[int, str | None] = {}  # id of a compiled kernel (kept by Triton's cache for the process) -> verdict


def refuse_wrong_pairs(compiled, layout: int, what: str) -> None:
    """Raise ``variants.DecodeRefused`` (a RuntimeError) when ``compiled`` (what ``kernel[grid](...)`` returned:
    Triton's compiled kernel; None or without TTGIR in the interpreter) decodes some register's two words under two
    scale blocks of ``layout``; each compiled kernel is read once. The launch has run: the caller raises before
    returning what it wrote."""
    asm = getattr(compiled, "asm", None)
    if layout not in PAIRED_LAYOUTS or not asm or "ttgir" not in asm:
        return
    key = id(compiled)
    if key not in _CHECKED:
        _CHECKED[key] = wrong_pairs(asm["ttgir"], layout)
    if _CHECKED[key]:
        raise DecodeRefused(
            f"{DECODE_REFUSED}{what}: this tile's compiled decode would apply a neighbouring block's scale to half the "
            f"weights ({_CHECKED[key]}); use another tile (tune refuses this one)"
        )
