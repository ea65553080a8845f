"""Shared memory of CUTLASS's SM120 NVFP4 grouped GEMM as FlashInfer's CUTLASS fused MoE builds it.

A model (no CUDA, no CUTLASS) of ``sizeof(GemmKernel::SharedStorage)``, the number CUTLASS passes to
``cudaFuncSetAttribute(MaxDynamicSharedMemorySize)`` (gemm_universal_adapter.h) and that fails with
"Error Internal" when it exceeds the 101376 B a block may use on SM120/SM121 (cutlass #2692, #3096).

For a tile (BM, BN, BK in FP4 elements) and an epilogue kind it gives:

- ``stages``: what CUTLASS's ``StageCountAutoCarveout`` picks: (capacity - scheduler/tensormap storage
  - epilogue carve-out) // per-stage bytes, where the per-stage bytes count A, B, SFA, SFB and a
  128 B-rounded barrier pair, and nothing else;
- ``mainloop_bytes`` / ``epilogue_bytes``: ``sizeof`` of the collectives' SharedStorage;
- ``total_bytes``: ``sizeof`` of the kernel's SharedStorage, laid out with C++ struct rules (every
  ``alignas(1024)`` / ``alignas(512)`` / ``aligned_struct<128>`` member and the round-up of each struct
  to its alignment), which is what the stage-count formula does not see;
- ``fits``: ``total_bytes <= 101376``, and ``max_fitting_stages`` for the tile.

Sources (line numbers at NVIDIA/cutlass 7107b055; FlashInfer pins cutlass b46b16d0, whose storage
structs and builders used here are the same; FlashInfer at fb28d724):

- C  = include/cutlass/gemm/collective/builders/sm120_blockscaled_mma_builder.inl
- SC = include/cutlass/gemm/collective/builders/sm100_blockscaled_umma_builder.inl (the stage count)
- M  = include/cutlass/gemm/collective/sm120_blockscaled_mma_array_tma.hpp (mainloop SharedStorage)
- EB = include/cutlass/epilogue/collective/builders/sm120_builder.inl
- E  = include/cutlass/epilogue/collective/sm90_epilogue_array_tma_warpspecialized.hpp
- K  = include/cutlass/gemm/kernel/sm90_gemm_array_tma_warpspecialized_cooperative.hpp
- P  = include/cutlass/pipeline/sm90_pipeline.hpp
- L  = FlashInfer csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/moe_gemm/launchers/
  moe_gemm_tma_ws_launcher.inl
- S  = FlashInfer csrc/nv_internal/tensorrt_llm/cutlass_extensions/include/cutlass_extensions/epilogue/
  fusion/sm90_visitor_scatter.hpp

Checked against the one measured breakdown in the issues: cutlass #2692 (example 79d, 128x128x128,
half C, FP4 D) printed mainloop 74752 B, epilogue 11264 B, kernel 87040 B; ``example_79d()`` gives
the same three numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

# include/cutlass/arch/arch.h:45  constexpr int sm120_smem_capacity_bytes = 101376;
SM120_SMEM_CAPACITY = 101376

BARRIER = 8  # cutlass::arch::ClusterBarrier / ClusterTransactionBarrier: one uint64_t
TMA_DESCRIPTOR = 128  # cute::TmaDescriptor (CUtensorMap), 64-byte aligned, 128 bytes
SF_VEC = 16  # NVFP4: one ue4m3 scale per 16 elements (nv_float4_t, L lines 306-316)
SF_BLK_MN = 128  # Sm1xxBlockScaledBasicChunk::Blk_MN, include/cutlass/detail/sm100_blockscaled_layout.hpp:51
SF_BLK_SF = 4  # Sm1xxBlockScaledBasicChunk::Blk_SF, ibid. :52

EPILOGUES = ("default", "finalize")


def _round_up(x: int, a: int) -> int:
    return -(-x // a) * a


def _struct(*members: tuple[int, int]) -> tuple[int, int]:
    """(size, alignment) of a C++ struct with members given as (size, alignment), in order."""
    off, align = 0, 1
    for size, a in members:
        off = _round_up(off, a) + size
        align = max(align, a)
    return _round_up(max(off, 1), align), align


def _pipeline(stages: int) -> tuple[int, int]:
    # P:280-283 PipelineTmaAsync, P:775-778 PipelineTransactionAsync, P:1005-1011 PipelineAsync:
    # a full and an empty barrier per stage.
    return 2 * stages * BARRIER, BARRIER


# --------------------------------------------------------------------------------------------- mainloop


def sf_bytes(mn: int, bk: int) -> int:
    """Scale-factor bytes of one stage for an operand with `mn` rows (SFA: BM, SFB: max(BN, 128)).

    C:186-216 builds the smem SF atom as ((mn/128, 32, 4), ((16, NSF), (4/NSF, BK/16/4))) with the
    16-wide vector mode at stride 0; SC:79-80 counts it with size(filter_zeros(...)), i.e. one byte per
    16 K-elements per row: mn * bk / 16.  SFB uses max(BN, 128) rows (C:209).
    """
    blocks_mn = mn // SF_BLK_MN
    return blocks_mn * 32 * 4 * SF_BLK_SF * (bk // SF_VEC // SF_BLK_SF)


def _sfb_rows(bn: int) -> int:
    return max(bn, 128)  # C:209 sSFBTileShape_N = max(size<1>(TileShape), 128)


def formula_stage_bytes(bm: int, bn: int, bk: int) -> int:
    """Per-stage bytes of SC:70-88 (sm100_compute_stage_count_or_override_blockscaled)."""
    pipeline = _round_up(_pipeline(1)[0], 128)  # SC:76 round_up(sizeof(PipelineTmaUmmaAsync<1>::SharedStorage), 128)
    a = bm * bk * 4 // 8  # SC:83 bits_to_bytes(4 * BM * BK); SmemAllocTypeA is the 4-bit type (C:150)
    b = bn * bk * 4 // 8  # SC:84
    return a + b + pipeline + sf_bytes(bm, bk) + sf_bytes(_sfb_rows(bn), bk)


def reduced_capacity(capacity: int = SM120_SMEM_CAPACITY) -> int:
    """C:244-261 for a grouped (pointer-array) kernel: capacity minus scheduler pipeline
    (PipelineAsyncSharedStorage<8>), two TMA descriptors, TensorMapReady pipeline (PipelineAsync<3>);
    the CLC response storage is 0 for grouped kernels (C:246)."""
    return capacity - _pipeline(8)[0] - 2 * TMA_DESCRIPTOR - _pipeline(3)[0]


def formula_stages(bm: int, bn: int, bk: int, carveout: int, capacity: int = SM120_SMEM_CAPACITY) -> int:
    """SC:87 (CapacityBytes - carveout_bytes) / stage_bytes, CapacityBytes = reduced_capacity (C:263-264)."""
    return (reduced_capacity(capacity) - carveout) // formula_stage_bytes(bm, bn, bk)


def mainloop_tensor_storage(bm: int, bn: int, bk: int, stages: int) -> tuple[int, int]:
    """M:270-275: alignas(1024) smem_A, alignas(1024) smem_B, alignas(16) smem_SFA, alignas(16) smem_SFB."""
    return _struct(
        (stages * bm * bk // 2, 1024),
        (stages * bn * bk // 2, 1024),
        (stages * sf_bytes(bm, bk), 16),
        (stages * sf_bytes(_sfb_rows(bn), bk), 16),
    )


def mainloop_tensormaps() -> tuple[int, int]:
    return _struct(*[(TMA_DESCRIPTOR, 128)] * 4)  # M:277-282 A, B, SFA, SFB descriptors, aligned_struct<128>


def mainloop_shared_storage(bm: int, bn: int, bk: int, stages: int) -> int:
    """sizeof(CollectiveMainloop::SharedStorage), M:269-286 (pipeline: PipelineTmaAsync<Stages>, M:168)."""
    pipe = _pipeline(stages)
    return _struct(mainloop_tensor_storage(bm, bn, bk, stages), mainloop_tensormaps(), (pipe[0], 16))[0]


# --------------------------------------------------------------------------------------------- epilogue


@dataclass(frozen=True)
class EpilogueLayout:
    kind: str
    epi_tile: tuple[int, int]
    stages_c: int
    stages_d: int
    reuse_smem_c: bool
    tensor_storage: tuple[int, int]  # (size, alignment) of CollectiveEpilogue::TensorStorage
    tensormaps: tuple[int, int]
    load_pipeline_stages: int
    shared_storage: int  # sizeof(CollectiveEpilogue::SharedStorage): FlashInfer's carve-out (L:436-438)


def epilogue_layout(bm: int, bn: int, kind: str = "default", swap_ab: bool = False) -> EpilogueLayout:
    """FlashInfer's SM120 epilogue (L:293-300, 376-380, 403-434): schedule TmaWarpSpecialized with pointer
    strides (so EB:107-109 picks Sm120PtrArrayTmaWarpSpecialized -> collective E), EpilogueTileAuto.

    default : C = D = bf16 (ElementCSafe = ElementD on SM120, L:300, 380), LinearCombination fusion.
    finalize: C = bf16, D = void, fusion ScaledAccPerColBiasPerRowScaleScatter (L:415-420, S:421-508);
              the scatter node keeps no smem of its own (S:73) and reduces through the epilogue's smem_D.
    """
    if kind not in EPILOGUES:
        raise ValueError(f"epilogue kind must be one of {EPILOGUES}, got {kind!r}")
    out_bytes = 2  # bf16: OutputTypeAdaptor_t<bf16> = bf16 (moe_gemm_kernels.h:137)
    # EB:163-198 EpilogueTileAuto, non-FP6, non-sparse: (64, 32) for BN >= 32.
    epi_n = bn if bn < 32 else 32
    epi_m = 128 if bn < 16 else 64
    epi_tiles = (bm // epi_m) * (bn // epi_n)  # EB:83
    c_bits = out_bytes * 8
    d_bits = out_bytes * 8 if kind == "default" else 0  # numeric_size.h:62 sizeof_bits<void> = 0
    reuse = c_bits == d_bits and d_bits > 8  # EB:94
    stages_d = min(epi_tiles, 2)  # EB:99
    stages_c = max(min(epi_tiles, 2), stages_d + 1) if reuse else stages_d  # EB:102-103
    # E:173-188: smem C/D tiles (EpiM, EpiN, stages), aligned for their swizzle.  A K-major bf16 row of
    # 32 elements is 64 B -> SW64 atom, Swizzle<2,4,3> -> alignment 1 << 9 = 512 (detail/layout.hpp:423).
    row_bytes = epi_n * out_bytes
    swz_align = {128: 1024, 64: 512, 32: 256}.get(row_bytes, 128)
    tile_bytes = epi_m * epi_n * out_bytes
    if kind == "default":
        # E:161 ReuseSmemC and D present -> E:211-214 union of smem_C / smem_D, both with StagesC stages.
        collective = _struct((stages_c * tile_bytes, swz_align))
        fusion = (1, 1)  # LinearCombination: scalar broadcasts, empty SharedStorage (an empty member is 1 B)
    else:
        # D void: E:152 NonVoidElementD = ElementAux = bf16, E:161 ReuseSmemC false -> E:201-204 smem_C + smem_D.
        collective = _struct((stages_c * tile_bytes, swz_align), (stages_d * tile_bytes, swz_align))
        # S:441-508: the per-column (BN-wide) operand is an Sm90RowBroadcast whose SharedStorage is
        # array_aligned<Element, CTA_N> (sm90_visitor_load_tma_warpspecialized.hpp:1377-1379): the bf16 bias,
        # or with swap_ab the fp32 router scale; Sm90ColBroadcast / scalar / scatter nodes are empty.
        fusion = (bn * (4 if swap_ab else 2), 16)
    tensor_storage = _struct(collective, fusion)  # E:234-241
    tensormaps = _struct((TMA_DESCRIPTOR, 128), (2 * TMA_DESCRIPTOR, 128))  # E:243-246, 2 epilogue warp groups
    load = _pipeline(stages_c)  # E:218, E:248-249 PipelineTransactionAsync<StagesC>
    shared = _struct(tensor_storage, tensormaps, load)[0]  # E:233-250
    return EpilogueLayout(kind, (epi_m, epi_n), stages_c, stages_d, reuse, tensor_storage, tensormaps, stages_c, shared)


# --------------------------------------------------------------------------------------------- kernel


def kernel_shared_storage(bm: int, bn: int, bk: int, stages: int, epi: EpilogueLayout) -> int:
    """sizeof(GemmKernel::SharedStorage), K:197-226 (the SM120 grouped kernel reuses this SM90 shell)."""
    tensors = _struct(mainloop_tensor_storage(bm, bn, bk, stages), epi.tensor_storage, (0, 128))  # K:198-204
    pipelines = _struct(
        (_pipeline(8)[0], 16),  # K:211 scheduler: PipelineAsyncSharedStorage<8> (sm90_tile_scheduler_group.hpp:112)
        (_pipeline(stages)[0], 16),  # K:212 mainloop PipelineTmaAsync<Stages>
        (_pipeline(epi.load_pipeline_stages)[0], 16),  # K:213 epilogue load pipeline
        (2 * BARRIER, 16),  # K:214, K:194 OrderedSequenceBarrier<1,2>: barrier_[1][2]
    )
    responses = (8 * 16, 16)  # K:217, K:160: 8 x WorkTileInfo (4 x int32, sm90_tile_scheduler_group.hpp:66-70)
    tensormaps = _struct((mainloop_tensormaps()[0], 128), (epi.tensormaps[0], 128))  # K:219-225
    return _struct(tensors, pipelines, responses, tensormaps)[0]


@dataclass(frozen=True)
class TileSmem:
    tile: tuple[int, int, int]
    epilogue: str
    stages: int  # what StageCountAutoCarveout picks
    formula_stage_bytes: int
    carveout: int  # sizeof(CollectiveEpilogue::SharedStorage)
    mainloop_bytes: int  # sizeof(CollectiveMainloop::SharedStorage) at `stages`
    epilogue_bytes: int
    total_bytes: int  # sizeof(GemmKernel::SharedStorage) at `stages`: the launch requirement
    capacity: int
    max_fitting_stages: int  # largest stage count whose real footprint fits (0: none >= 2)

    @property
    def fits(self) -> bool:
        return self.stages >= 2 and self.total_bytes <= self.capacity

    @property
    def overcommitted(self) -> bool:
        """CUTLASS's formula chose more stages than fit once the real layout is counted (cutlass #3096)."""
        return self.stages > self.max_fitting_stages >= 2


def sm120_grouped_gemm_smem(
    bm: int, bn: int, bk: int, epilogue: str = "default", *, swap_ab: bool = False, capacity: int = SM120_SMEM_CAPACITY
) -> TileSmem:
    """Shared memory of FlashInfer's SM120 NVFP4 grouped GEMM for tile (BM, BN, BK), BK in FP4 elements
    (FlashInfer's CtaShape128x128x64B is BK = 64 bytes * 8 / 4 bits = 128 elements,
    moe_gemm_template_dispatch_tma_ws.h:415-422)."""
    if bm % SF_BLK_MN or bk % (SF_VEC * SF_BLK_SF) or bn < 32:
        raise ValueError(f"unsupported SM120 block-scaled tile {bm}x{bn}x{bk}")
    epi = epilogue_layout(bm, bn, epilogue, swap_ab)
    stages = formula_stages(bm, bn, bk, epi.shared_storage, SM120_SMEM_CAPACITY)
    fitting = [s for s in range(2, 16) if kernel_shared_storage(bm, bn, bk, s, epi) <= capacity]
    return TileSmem(
        tile=(bm, bn, bk),
        epilogue=epilogue,
        stages=stages,
        formula_stage_bytes=formula_stage_bytes(bm, bn, bk),
        carveout=epi.shared_storage,
        mainloop_bytes=mainloop_shared_storage(bm, bn, bk, max(stages, 1)),
        epilogue_bytes=epi.shared_storage,
        total_bytes=kernel_shared_storage(bm, bn, bk, max(stages, 1), epi),
        capacity=capacity,
        max_fitting_stages=max(fitting, default=0),
    )


def fits(bm: int, bn: int, bk: int, epilogue: str = "default", capacity: int = SM120_SMEM_CAPACITY) -> bool:
    return sm120_grouped_gemm_smem(bm, bn, bk, epilogue, capacity=capacity).fits


# FlashInfer's SM120 tile list (cutlass_heuristic.cpp:639-645, moe_gemm_template_dispatch_tma_ws.h:300-317),
# in FP4 elements.
FLASHINFER_SM120_TILES = (
    (128, 128, 128),
    (128, 128, 256),
    (128, 256, 128),
    (256, 128, 128),
    (128, 64, 128),
    (128, 64, 256),
    (128, 32, 128),
    (128, 32, 256),
)


def example_79d() -> tuple[int, int, int]:
    """CUTLASS example 79d (128x128x128, C half, D e2m1 with scale-factor output), the configuration that
    cutlass #2692 measured: (mainloop, epilogue, kernel) SharedStorage bytes.  Its epilogue is the
    non-reused C (2 x 64x32 half, SW64, 512-aligned) + D (2 x 64x32 FP4, 128-aligned) layout."""
    tensor = _struct(_struct((2 * 64 * 32 * 2, 512), (2 * 64 * 32 // 2, 128)), (1, 1))
    tmaps = _struct((TMA_DESCRIPTOR, 128), (2 * TMA_DESCRIPTOR, 128))
    shared = _struct(tensor, tmaps, _pipeline(2))[0]
    epi = EpilogueLayout("79d", (64, 32), 2, 2, False, tensor, tmaps, 2, shared)
    stages = formula_stages(128, 128, 128, shared)
    return mainloop_shared_storage(128, 128, 128, stages), shared, kernel_shared_storage(128, 128, 128, stages, epi)


def table(capacity: int = SM120_SMEM_CAPACITY) -> list[TileSmem]:
    return [sm120_grouped_gemm_smem(*t, e, capacity=capacity) for t in FLASHINFER_SM120_TILES for e in EPILOGUES]
