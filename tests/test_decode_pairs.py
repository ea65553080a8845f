"""The decode's register pairs (``variants.w4a16_pairs``): in the kernel layouts one scale code serves a register's two
words, so a compiled GEMM may run only where the compiler pairs words of one scale block. Read from TTGIR text here,
and from ahead-of-time compiles for sm_90 and sm_120 (no GPU)."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from pathlib import Path

import pytest

from sglang_glm5 import autotune, tuner, variants
from sglang_glm5.hardware import TARGETS
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16_pairs, w4a16_tiles

_ASM = (
    '%q0 = tt.elementwise_inline_asm "{\\0Amad.lo.u32 s, $2, 0x00100010, 0x76007600;\\0A}" {constraints = "=r,r,r,r", '
    "packed_element = 2 : i32, pure = true} %p, %s : tensor<64x16xi16, {layout}>, tensor<64x16xi32, {layout}> -> "
    "tensor<64x16xbf16, {layout}> loc(#loc1)"
)
# Triton 3.8's layout for the decode of 16x64x64-w4 on sm_90 (register pairs: word slots c and c + 2)
_LINEAR = (
    "#linear = #ttg.linear<{register = [[0, 2], [0, 1], [0, 8]], lane = [[0, 4], [1, 0], [2, 0], [4, 0], [8, 0]], "
    "warp = [[16, 0], [32, 0]], block = []}>"
)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    return tmp_path


def _ttgir(layout: str, alias: str = "") -> str:
    return f"{alias}\nmodule {{\n  {_ASM.replace('{layout}', layout)}\n}}\n"


# (TTGIR, weight layout (nvfp4.LAYOUTS index), wrong?), each with why
CASES = [
    (_ttgir("#ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 2}>"), 2, False),  # wgmma's operand: adjacent words
    (_ttgir("#ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 4}>"), 1, False),  # mma.sync's (sm_120): four words
    (_ttgir("#ttg.dot_op<{opIdx = 0, parent = #mma, kWidth = 1}>"), 2, True),  # one word a register: pairs unknown
    (_ttgir("#linear", _LINEAR), 2, True),  # slots 0 and 2 are blocks 0 and 1 in kernel_wgmma
    (_ttgir("#linear", _LINEAR), 1, False),  # and one block (words 0-3) in the kernel layout
    (_ttgir("#linear", _LINEAR), 0, False),  # the checkpoint layout scales each word on its own: nothing to check
    (_ttgir("#blocked", "#blocked = #ttg.blocked<{sizePerThread = [1, 2]}>"), 2, True),  # a layout it cannot read
    ("module {\n}\n", 2, True),  # no decode found: refused, not passed
]


@pytest.mark.parametrize("ttgir,layout,wrong", CASES)
def test_wrong_pairs_reads_the_decode_layout(ttgir, layout, wrong):
    assert bool(w4a16_pairs.wrong_pairs(ttgir, layout)) == wrong


def test_kernel_wgmma_scale_blocks():
    # block b of each 16 word slots is 2b, 2b + 1, 2b + 8, 2b + 9; the kernel layout's is words 4b .. 4b + 3
    assert [w4a16_pairs.scale_block(w, 2) for w in range(18)] == [0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [w4a16_pairs.scale_block(w, 1) for w in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_a_tile_whose_decode_pairs_two_blocks_is_refused_on_sm90_and_kept_on_sm120(fresh_cache):
    # 16x64x64-w4 (Triton 3.8): a linear layout for the decode on sm_90, where kernel_wgmma puts slots c and c + 2 in
    # two blocks; on sm_120 the kernel layout keeps them in one
    tile = GemmConfig(16, 64, 64, num_warps=4, num_stages=2)
    on_sm90 = w4a16_tiles.compiled_shared_bytes("gemm1", tile, TARGETS["h200"], memo=False)
    on_sm120 = w4a16_tiles.compiled_shared_bytes("gemm1", tile, TARGETS["rtx-pro-6000"], memo=False)
    if isinstance(on_sm90, int):
        pytest.skip("this Triton gives the tile a layout that pairs one block's words on sm_90")
    assert on_sm90.startswith(w4a16_tiles.DECODE_REFUSED) and "two scale blocks" in on_sm90
    assert isinstance(on_sm120, int)
    # the tuner prunes it under the decode's own count, beside a tile of one block's pairs that it keeps
    good, h200 = GemmConfig(16, 64, 128, num_warps=4, num_stages=2), TARGETS["h200"]
    report = tuner.TuneReport()
    kept = tuner.prune(
        [tile, good], h200, report, lambda c: w4a16_tiles.model_shared_floor("gemm1", c),
        lambda configs: w4a16_tiles.compiled_shared_bytes_many([("gemm1", c) for c in configs], h200, memo=False),
        verdicts=report.verdicts_for("gemm1"),
    )  # fmt: skip
    assert [c for c, _ in kept] == [good]
    assert (report.pruned_by_decode, report.pruned_by_compiler, report.pruned) == (1, 0, 1)
    assert "(0 by the model, 0 by the compiler, 1 for their decode)" in report.summary()
    (line,) = report.space_lines(h200)
    assert line.endswith("1 fit, 1 refused for a decode that would pair two scale blocks; largest feasible tile "
                         f"{good.label} ({kept[0][1]} B)"), line  # fmt: skip


def test_every_shipped_h200_entry_and_the_heuristic_decode_under_their_own_scales(fresh_cache):
    # The Triton forms of every tile the op may run on sm_90 from the shipped cache (the Gluon kernels lay out their
    # own decode) and the heuristic's tiles on both targets
    path = Path(str(resources.files("sglang_glm5.configs"))) / "autotune" / "h200.json"
    raw = json.loads(path.read_text())["entries"]
    entries = [(autotune.key_kernel_field(key), GemmConfig(**e["config"])) for key, e in raw.items()]
    variant = variants.get("w4a16")
    items, heuristic = w4a16_tiles.launchable_tiles(entries, variant), w4a16_tiles.launchable_tiles([], variant)
    assert len(items) > len(heuristic), "the shipped entries add tiles to the check"
    assert all(not c.gluon and not c.programs_per_sm for _, c in items), "plain Triton forms"
    for target, checked in ((TARGETS["h200"], items), (TARGETS["rtx-pro-6000"], heuristic)):
        verdicts = w4a16_tiles.compiled_shared_bytes_many(checked, target)
        refused = [(k, c.label, v) for (k, c), v in zip(checked, verdicts, strict=True) if isinstance(v, str)]
        assert not refused, refused


class _Compiled:
    """What ``kernel[grid](...)`` returns, as far as the runtime check reads it."""

    def __init__(self, ttgir: str):
        self.asm = {"ttgir": ttgir}


def test_the_op_refuses_a_launched_kernel_that_pairs_two_blocks():
    bad, good = _Compiled(CASES[3][0]), _Compiled(CASES[0][0])
    with pytest.raises(variants.DecodeRefused, match="neighbouring block's scale") as refused:
        w4a16_pairs.refuse_wrong_pairs(bad, 2, "gemm1 16x64x64-w4-s2")
    assert str(refused.value).startswith(variants.DECODE_REFUSED) and isinstance(refused.value, RuntimeError)
    with pytest.raises(RuntimeError):  # read once, remembered
        w4a16_pairs.refuse_wrong_pairs(bad, 2, "gemm1 16x64x64-w4-s2")
    w4a16_pairs.refuse_wrong_pairs(good, 2, "gemm1 16x64x256-w4-s3")
    w4a16_pairs.refuse_wrong_pairs(bad, 0, "the checkpoint layout")  # a scale per word: nothing to check
    w4a16_pairs.refuse_wrong_pairs(None, 2, "the interpreter")  # no compiled kernel to read


def test_the_tuner_counts_a_launch_the_decode_check_refuses_with_the_decodes(fresh_cache):
    # A candidate whose launch raises the decode's refusal (another Triton at the GPU than at the AOT step, say) is
    # skipped and counted with the decode's refusals, not the compiler's
    space = [GemmConfig(16, 64, 128, num_warps=4, num_stages=2), GemmConfig(16, 128, 128, num_warps=4, num_stages=2)]
    variant = dataclasses.replace(variants.get("w4a16"), search_space=lambda bucket: space)

    refused = []

    def bench(kernel, cfg, bucket):
        if cfg.block_n == 128:  # the tile and any form of it the tuner also times
            refused.append((kernel, cfg))
            raise variants.DecodeRefused(f"{variants.DECODE_REFUSED}{kernel} {cfg.label}: pairs two blocks")
        return 1.0

    entries, report = tuner.tune(TARGETS["h200"], MoeShape(8, 256, 256), [16], bench, variant=variant)
    assert {k for k, _ in refused} == {"gemm1", "gemm2"}
    assert (report.pruned_by_decode, report.pruned_by_compiler) == (len(refused), 0), report.summary()
    assert all(e.config.block_n == 64 for e in entries.values())
