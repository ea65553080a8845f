"""The W4A16 op's small launches (routing, activation layout, top-k sum) compile for sm_120 and sm_90 ahead of time.

The GEMMs' configs are compiled for sm_120 in tests/test_tiles.py; these kernels have no config and are compiled only
when the op first runs on a GPU, which no CI machine has, and no SM120 GPU has run them. Each is compiled here in the
forms the op launches (sorted routing or a block per pair, with and without the activation layout, either K order,
a decode step's narrow walk over the ids and a prefill step's wide one, programmatic dependent launch on; the sum
with and without split partials and a row map), on the CPU, in the ahead-of-time workers (``sglang_glm5.aot``).
"""

from sglang_glm5 import routing
from sglang_glm5.aot import run_jobs

# (consts, warps): decode steps (16 ids a step, 4 warps), a busy decode step (GLM-5 B = 256: 2048 ids, the activation
# layout in tiles of PERMUTE_T_BUSY rows) and a prefill step's wide walk over the ids (route_block)
WIDE_BLOCK, WIDE_WARPS = routing.route_block(routing.WIDE_ROUTE_PAIRS, 32)
BUSY_BLOCK, BUSY_WARPS = routing.route_block(2048, 32)
BUSY_ROWS = routing.permute_rows(256)
ALIGN = [
    ({"BLOCK_M": block_m, "E_PAD": e_pad, "BLOCK": block, "PERMUTE": permute, "PERMUTE_T": rows,
      "PERMUTE_K": routing.PERMUTE_K, "PDL": True, "WGMMA": wgmma, "EACH_PAIR": each_pair}, warps)
    for each_pair, permute, wgmma, e_pad, block_m, block, warps, rows in [
        (False, True, False, 256, 16, 16, 4, routing.PERMUTE_T), (True, True, False, 16, 16, 16, 4, routing.PERMUTE_T),
        (True, True, True, 16, 16, 16, 4, routing.PERMUTE_T), (False, False, False, 32, 16, 16, 4, routing.PERMUTE_T),
        (True, False, False, 16, 16, 16, 4, routing.PERMUTE_T),
        (False, True, True, 32, 16, BUSY_BLOCK, BUSY_WARPS, BUSY_ROWS),
        (False, True, False, 256, 16, BUSY_BLOCK, BUSY_WARPS, BUSY_ROWS),
        (False, True, True, 32, 128, WIDE_BLOCK, WIDE_WARPS, routing.PERMUTE_T),
    ]
]  # fmt: skip
# the chunked routing (prefill sizes): its two launches as route_chunked makes them, GLM-5's 32 and 256 experts
CHUNKED = [
    ("count", {"E_PAD": 32, "CHUNK": routing.ROUTE_CHUNK, "PERMUTE": True, "PERMUTE_T": routing.PERMUTE_T,
               "PERMUTE_K": routing.PERMUTE_K, "WGMMA": True}, 8),
    ("place", {"BLOCK_M": 128, "E_PAD": 256, "CHUNK": routing.ROUTE_CHUNK, "ROWS": 16}, 8),
]  # fmt: skip
SUM = [
    ({"TOP_K": 8, "SPLITS": splits, "BLOCK_H": block_h, "HAS_ROW_MAP": row_map, "INTERPRETER": False, "PDL": True},
     routing.SUM_WARPS)
    for splits, row_map, block_h in [
        (1, False, routing.SUM_BLOCK_H_FEW), (3, False, routing.SUM_BLOCK_H), (1, True, routing.SUM_BLOCK_H),
    ]
]  # fmt: skip


def test_small_launches_compile_for_sm120_and_sm90():
    jobs = [[kernel, consts, arch, warps] for arch in (120, 90) for kernel, forms in (("align", ALIGN), ("sum", SUM))
            for consts, warps in forms]  # fmt: skip
    results = run_jobs("sglang_glm5.routing:aot_job", jobs)
    for (kernel, consts, arch, _), ptx in zip(jobs, results, strict=True):
        assert isinstance(ptx, str) and f".target sm_{arch}" in ptx, f"{kernel} {consts} sm_{arch}: {str(ptx)[:200]}"
        assert "griddepcontrol.wait" in ptx, f"{kernel} sm_{arch}: PDL waits for the kernel before it"


def test_the_chunked_routing_compiles_for_sm120_and_sm90():
    jobs = [[kernel, consts, arch, warps] for arch in (120, 90) for kernel, consts, warps in CHUNKED]
    for (kernel, _, arch, _), ptx in zip(jobs, run_jobs("sglang_glm5.routing:aot_job", jobs), strict=True):
        assert isinstance(ptx, str) and f".target sm_{arch}" in ptx, f"{kernel} sm_{arch}: {str(ptx)[:300]}"
