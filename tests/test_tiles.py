"""Shared memory per target: the analytic model against Triton's ahead-of-time compile (no GPU)."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from sglang_glm5 import aot, autotune, tuner
from sglang_glm5.aot import package_sources, source_digest
from sglang_glm5.hardware import TARGETS, resolve
from sglang_glm5.shapes import MoeShape
from sglang_glm5.tiles import GemmConfig
from sglang_glm5.variants import w4a16, w4a16_tiles

SAMPLE = [
    GemmConfig(16, 64, 128, 4, 3),  # the decode heuristic
    GemmConfig(32, 32, 128, 2, 2),  # narrow N, long K
    GemmConfig(64, 128, 64, 4, 3),  # the prefill heuristic
    GemmConfig(16, 128, 256, 8, 4),  # two warpgroups, long K
    GemmConfig(64, 128, 128, 4, 4),  # near the SM120 limit
    GemmConfig(128, 128, 128, 8, 4),  # over it on sm_120, under on sm_90
]


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLANG_GLM5_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("target", ["rtx-pro-6000", "h200"])
@pytest.mark.parametrize("kernel", w4a16_tiles.KERNELS)
def test_model_bounds_the_compiler(target, kernel, fresh_cache):
    t = resolve(target)
    verdicts = []
    for cfg, compiled in zip(
        SAMPLE, w4a16_tiles.compiled_shared_bytes_many([(kernel, c) for c in SAMPLE], t), strict=True
    ):
        modelled = w4a16_tiles.model_shared_bytes(kernel, cfg, t)
        assert compiled <= modelled, f"{cfg.label} on {t.sm}: model {modelled} B < compiler {compiled} B"
        verdicts.append(t.fits(compiled))
    if target == "rtx-pro-6000":
        assert verdicts[0] and not verdicts[-1], "the sample must hold a config on each side of 101376 B"


def test_compiled_shared_bytes_is_memoized_on_disk(fresh_cache):
    cfg, t = SAMPLE[0], TARGETS["rtx-pro-6000"]
    first = w4a16_tiles.compiled_shared_bytes("gemm2", cfg, t)
    memo = json.loads((fresh_cache / "aot_shared.json").read_text())
    assert list(memo.values()) == [first]
    key = next(iter(memo))
    (fresh_cache / "aot_shared.json").write_text(json.dumps({key: 12345}))
    assert w4a16_tiles.compiled_shared_bytes("gemm2", cfg, t) == 12345  # read back, not recompiled


# The memo's fingerprint of a kernel file covers the package modules it imports: an edit to nvfp4_decode.py (the decode
# the GEMM kernels import) or to nvfp4.py (whose bit positions that decode reads) must compile them again.
@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("sglang_glm5.kernels.nvfp4_moe", {"moe_common.py", "nvfp4_decode.py", "nvfp4.py"}),
        ("sglang_glm5.kernels.nvfp4_w4a4", {"moe_common.py", "nvfp4_decode.py", "nvfp4.py"}),
        ("sglang_glm5.kernels.nvfp4_moe_gluon", {"nvfp4_decode.py", "nvfp4.py"}),
        # `from sglang_glm5.kernels import nvfp4_route as _k`: a module named through its package
        ("sglang_glm5.routing", {"nvfp4_route.py", "moe_common.py"}),
    ],
)
def test_source_digest_covers_the_package_modules_a_kernel_file_imports(module, imported):
    paths = package_sources(module)
    names = [p.name for p in paths]
    assert names[0] == f"{module.rpartition('.')[2]}.py" and imported <= set(names), names
    assert len(paths) == len(set(paths)), "a file read twice"


def test_source_digest_changes_with_an_imported_module(monkeypatch, tmp_path):
    source_digest.cache_clear()
    before = source_digest("sglang_glm5.kernels.nvfp4_moe")
    decode = next(p for p in package_sources("sglang_glm5.kernels.nvfp4_moe") if p.name == "nvfp4_decode.py")
    edited = tmp_path / "nvfp4_decode.py"
    edited.write_text(decode.read_text() + "\n# an edit\n")
    real = aot._source_file
    monkeypatch.setattr(aot, "_source_file", lambda m: edited if m.endswith(".nvfp4_decode") else real(m))
    source_digest.cache_clear()
    try:
        assert source_digest("sglang_glm5.kernels.nvfp4_moe") != before
    finally:
        source_digest.cache_clear()


def test_sm120_compile_uses_mma_sync_not_wgmma(fresh_cache):
    asm = w4a16_tiles.compiled_asm("gemm1", SAMPLE[2], TARGETS["rtx-pro-6000"])
    assert "mma.sync" in asm["ptx"] and "wgmma" not in asm["ptx"]
    assert ".target sm_120" in asm["ptx"]


def _shipped(name: str) -> dict:
    path = Path(str(resources.files("sglang_glm5.configs"))) / "autotune" / f"{name}.json"
    return json.loads(path.read_text())


def _gemm_of(key: str) -> tuple[str, tuple[int, ...]]:
    """("gemm1", (E, N, K)) of a cache key "...|gemm1.r4|E=32,N=4096,K=6144|m=1"."""
    fields = key.split("|")
    return fields[2].split(".")[0], tuple(int(v.split("=")[1]) for v in fields[3].split(","))


def test_every_shipped_sm120_entry_compiles_within_101376_bytes(fresh_cache):
    data = _shipped("rtx-pro-6000")
    assert data["_metadata"]["arch"] == 120 and data["entries"]
    target = TARGETS["rtx-pro-6000"]
    kernels = {key: _gemm_of(key)[0] for key in data["entries"]}
    assert all(key.split("|")[2].endswith(f".r{w4a16.KERNEL_REVISION}") for key in data["entries"]), "stale entries"
    items = sorted({(kernels[key], GemmConfig(**e["config"])) for key, e in data["entries"].items()}, key=str)
    seen = dict(zip(items, w4a16_tiles.compiled_shared_bytes_many(items, target), strict=True))
    for key, entry in data["entries"].items():
        kernel = kernels[key]
        cfg = GemmConfig(**entry["config"])
        verdict = seen[(kernel, cfg)]
        assert isinstance(verdict, int), f"{key}: {verdict}"  # not refused for its decode (w4a16_pairs)
        assert target.fits(verdict), f"{key}: {cfg.label} needs {verdict} B on sm_120"
        assert entry["measured"] is False, "no SM120 GPU measured these"


def test_the_shipped_sm120_entries_are_what_the_offline_tune_writes():
    """`sglang-glm5 tune --target rtx-pro-6000` for the shipped shapes and buckets writes the shipped entries: the
    file is the tuner's rule, not hand-made. Shared bytes are one Triton version's, the one the file names."""
    import triton

    data = _shipped("rtx-pro-6000")
    if triton.__version__ != data["_metadata"]["triton"]:
        pytest.skip(f"the shipped entries are Triton {data['_metadata']['triton']}'s, this is {triton.__version__}")
    target = TARGETS["rtx-pro-6000"]
    shapes = {(e, k, n // 2) for kernel, (e, n, k) in map(_gemm_of, data["entries"]) if kernel == "gemm1"}
    buckets = sorted({autotune.parse_bucket(key.split("|")[4].removeprefix("m=")) for key in data["entries"]})
    regenerated = {}
    for e, h, i in sorted(shapes):
        regenerated.update(tuner.tune(target, MoeShape(e, h, i), buckets, None)[0])
    assert set(regenerated) == set(data["entries"])
    for key, entry in regenerated.items():
        shipped = data["entries"][key]
        assert (entry.config, entry.shared_bytes) == (GemmConfig(**shipped["config"]), shipped["shared_bytes"]), key


@pytest.mark.parametrize("name", ["h200", "rtx-pro-6000"])
def test_every_shipped_entry_is_one_its_gemm_can_run(name):
    # The rules a lookup applies with the GEMM's shape (w4a16_tiles.check_config: block_k, and a one-K-step gemm2 tile
    # only where K fits its one step and N makes several tiles): no shipped entry is one a lookup would pass over.
    data = _shipped(name)
    for key, entry in data["entries"].items():
        kernel, enk = _gemm_of(key)
        w4a16_tiles.check_config(GemmConfig(**entry["config"]), kernel, enk)
    assert any(e["config"].get("one_k_step") for e in _shipped("h200")["entries"].values())


def test_heuristic_fits_every_target_by_the_model():
    for t in TARGETS.values():
        for m in (1, 16, 32, 64, 128, 4096):
            cfg = w4a16_tiles.heuristic_config(m)
            for kernel in w4a16_tiles.KERNELS:
                assert t.fits(w4a16_tiles.model_shared_bytes(kernel, getattr(cfg, kernel), t)), (t.name, m, kernel)


def test_resolve_targets():
    assert resolve("rtx-pro-6000").shared_per_block == 101376
    assert resolve("sm_121").shared_per_block == 101376
    assert resolve("sm90").shared_per_block == 232448
    assert resolve("sm80").shared_per_block == 166912
    assert resolve("sm86").shared_per_block == 101376
    with pytest.raises(ValueError, match="unknown 'gtx-1080'"):
        resolve("gtx-1080")


@pytest.mark.parametrize("cfg", [
    GemmConfig(16, 128, 256, 4, 3), GemmConfig(128, 256, 64, 8, 3, split_k=2), GemmConfig(16, 64, 256, 4, 3,
    programs_per_sm=1), GemmConfig(16, 128, 256, 4, 3, stream=2), GemmConfig(128, 128, 256, 8, 3, one_k_step=True),
])  # fmt: skip
def test_a_config_label_reads_back_as_the_config(cfg):
    assert GemmConfig.from_label(cfg.label) == cfg


@pytest.mark.parametrize("label", ["16x128x256-w4", "16x128-w4-s3", "16x128x256-w4-s3-k2-p1", "16x128x256-w3-s3",
                                   "16x128x256-w4-s3-sk2-p1", "16x128x256-w4-s3-sk9",
                                   # gemm2's one K step does not split, and the Gluon gemm2 has no such form
                                   "128x128x256-w8-s3-k2-1k", "128x128x256-w8-s3-gl-1k",
                                   "128x128x256-w8-s3-1k-gl"])  # fmt: skip
def test_a_malformed_or_invalid_label_is_refused(label):
    with pytest.raises(ValueError):
        GemmConfig.from_label(label)


@pytest.mark.parametrize("target", ["h200", "rtx-pro-6000"])
def test_the_stream_k_form_takes_no_more_shared_memory_than_the_tile(target):
    # The tuner times a tile's stream-K plan with the tile's shared bytes (variants.w4a16_plan.split_candidates): the
    # stream form, compiled only for configs that ask for it, must fit in what the tile's other forms take.
    t = resolve(target)
    for label in ("16x64x256-w4-s3", "16x128x256-w4-s3"):
        cfg = GemmConfig.from_label(label)
        plain, stream = w4a16_tiles.compiled_shared_bytes_many(
            [("gemm1", cfg), ("gemm1", GemmConfig.from_label(f"{label}-sk2"))], t
        )
        assert stream == plain, (target, label)


def test_a_config_without_its_plan_is_the_same_tile():
    # A split count, a split target and a stream-K schedule each fix the grid; without_plan leaves it to the call.
    tile = GemmConfig(16, 128, 256, 4, 3)
    assert not tile.has_plan and tile.without_plan() == tile
    for planned in (GemmConfig(16, 128, 256, 4, 3, split_k=2), GemmConfig(16, 128, 256, 4, 3, programs_per_sm=1),
                    GemmConfig(16, 128, 256, 4, 3, stream=2)):  # fmt: skip
        assert planned.has_plan and planned.without_plan() == tile


def test_a_one_k_step_tile_is_sized_for_the_one_form_it_runs_in():
    # GLM-5 TP8's gemm2 (I = 256) with routing blocks of 128 pairs: the 3-stage 128x128x256 tile fits sm_90 only in
    # the form that loads the activations once (233472 B in the forms that loop over K, past 232448: run 35), so a
    # config marked one_k_step is compiled in that form alone, and refused for gemm1.
    h200 = resolve("h200")
    cfg = GemmConfig.from_label("128x128x256-w8-s3-1k")
    shared = w4a16_tiles.compiled_shared_bytes("gemm2", cfg, h200, memo=False)
    assert h200.fits(shared) and h200.fits(w4a16_tiles.model_shared_bytes("gemm2", cfg, h200))
    assert shared < 128 * 256 * 2 + 3 * (128 * 256 // 2 + 128 * 256 // 16) + 128 * 128 * 4  # one activation tile
    with pytest.raises(ValueError, match="is a one-K-step gemm2 tile, got it for gemm1"):
        w4a16_tiles._compiled_shared("gemm1", cfg, 90)
