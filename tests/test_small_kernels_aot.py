"""The W4A16 op's small launches (routing, activation layout, top-k sum) compile for sm_120 and sm_90 ahead of time.

The GEMMs' configs are compiled for sm_120 in tests/test_tiles.py; these kernels have no config and are compiled only
when the op first runs on a GPU, which no CI machine has, and no SM120 GPU has run them. Each is compiled here in the
forms the op launches (sorted routing or a block per pair, with and without the activation layout, either K order,
programmatic dependent launch on; the sum with and without split partials and a row map), on the CPU, in the
ahead-of-time workers (``sglang_glm5.aot``).
"""

from sglang_glm5.aot import run_jobs

ALIGN = [
    {"BLOCK_M": 16, "E_PAD": e_pad, "BLOCK": 16, "PERMUTE": permute, "PERMUTE_T": 16, "PERMUTE_K": 256, "PDL": True,
     "WGMMA": wgmma, "EACH_PAIR": each_pair}
    for each_pair, permute, wgmma, e_pad in [
        (False, True, False, 256), (True, True, False, 16), (True, True, True, 16), (False, False, False, 32),
        (True, False, False, 16),
    ]
]  # fmt: skip
SUM = [
    {"TOP_K": 8, "SPLITS": splits, "BLOCK_H": block_h, "HAS_ROW_MAP": row_map, "INTERPRETER": False, "PDL": True}
    for splits, row_map, block_h in [(1, False, 512), (3, False, 1024), (1, True, 1024)]
]  # fmt: skip


def test_small_launches_compile_for_sm120_and_sm90():
    jobs = [[kernel, consts, arch] for arch in (120, 90) for kernel, forms in (("align", ALIGN), ("sum", SUM))
            for consts in forms]  # fmt: skip
    results = run_jobs("sglang_glm5.routing:aot_job", jobs)
    for (kernel, consts, arch), ptx in zip(jobs, results, strict=True):
        assert isinstance(ptx, str) and f".target sm_{arch}" in ptx, f"{kernel} {consts} sm_{arch}: {str(ptx)[:200]}"
        assert "griddepcontrol.wait" in ptx, f"{kernel} sm_{arch}: PDL waits for the kernel before it"
