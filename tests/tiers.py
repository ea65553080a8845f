"""The two tiers of the suite.

``python -m pytest`` runs the fast tier: every behaviour at least once, in about five minutes on 2 cores.
``--tier exhaustive`` runs what is listed here and nothing else; ``--tier all`` runs both. ``.ci/run`` runs both
tiers, one after the other, on every submission.

An entry is a test id (or an fnmatch pattern over test ids, ``[[]`` for a literal bracket) with the reason it is
in the slower tier. Most entries are cases of a parametrized grid whose other cases stay in the fast tier: the
behaviour is tested on every change, and the rest of the grid on every submission. The others are sweeps over
every shipped cache entry or whole offline tunes, each compiling tens of kernels; a cheaper test of the same
promise stays fast where one exists (named in the reason).
"""

from __future__ import annotations

import fnmatch

GRID = "another case of this grid stays in the fast tier"

EXHAUSTIVE: dict[str, str] = {
    # Sweeps over every shipped entry, and whole offline tunes (tens of AOT compiles each)
    "test_decode_pairs.py::test_every_shipped_h200_entry_and_the_heuristic_decode_under_their_own_scales":
        "compiles every shipped sm_90 tile; test_a_tile_whose_decode_pairs_two_blocks_is_refused stays fast",
    "test_decode_pairs.py::test_the_tuner_counts_a_launch_the_decode_check_refuses_with_the_decodes":
        "a whole tune through the interpreter",
    "test_gluon.py::test_every_gluon_tile_of_the_shipped_h200_cache_compiles_for_sm90":
        "compiles every shipped Gluon tile; test_compiles_for_sm90_with_async_wgmma stays fast",
    "test_stock_configs.py::test_every_shipped_config_fits_sm120":
        "compiles every shipped stock-Triton config for sm_120",
    "test_tiles.py::test_the_shipped_sm120_entries_are_what_the_offline_tune_writes":
        "a whole offline tune; test_offline_tune_stores_feasible_unmeasured_picks stays fast",
    "test_autotune.py::test_offline_tune_prints_per_gemm_the_candidates_and_what_shared_memory_rules_out":
        "a whole offline tune of both GEMMs",
    "test_autotune.py::test_an_offline_pick_holds_the_programs_an_sm_its_launch_is_sized_for": "a whole offline tune",
    "test_autotune.py::test_tune_takes_fractional_batch_sizes_and_w4a4_refuses_them": "a whole offline tune",
    "test_autotune.py::test_splits_only_times_the_tile_in_use_with_each_split_count_and_keeps_the_fastest":
        "times every split count through the interpreter",
    "test_autotune.py::test_splits_only_stores_a_stream_k_plan_only_where_it_beats_the_default":
        "times every stream-K trial through the interpreter",
    "test_w4a4_select.py::test_tune_on_the_gpu_stores_the_threshold_only_after_the_check_passes[[]False]":
        "the passing check runs every W4A4 kernel through the interpreter; the failing case stays fast",
    "test_w4a4_select.py::test_a_failing_retune_takes_back_the_earlier_threshold": "two tunes through the interpreter",
    "test_w4a4_select.py::test_a_w4a4_candidate_that_fails_on_the_gpu_is_skipped": "a tune through the interpreter",
    "test_w4a4.py::test_tiles_are_picked_by_tokens_per_global_expert": "W4A4 kernels at four sizes in the interpreter",
    "test_wheel.py::*": "builds and installs a wheel, then two offline tunes; quickstart's tests stay fast",
    "test_first_contact.py::test_a_test_run_leaves_home_untouched": "a pytest run in a subprocess",
    "test_stock_configs.py::test_stock_sm90_configs_for_these_shapes_on_sm120":
        "compiles SGLang's own H100/H200 configs for sm_120 (the fixture the sweep above shares)",
    "test_autotune.py::test_offline_tune_stores_feasible_unmeasured_picks":
        "a whole offline tune; test_tune_offline_stores_aot_checked_unmeasured_picks_in_the_user_cache (W4A4) and "
        "quickstart's tile check stay fast",
    "test_w4a4_select.py::test_tune_on_the_gpu_stores_the_threshold_only_after_the_check_passes[[]True]":
        "a tune through the interpreter; test_selfcheck_passes_the_interpreted_kernels_and_records_nothing stays fast",
    "test_accuracy.py::test_run_loadtest_script_reports_accuracy_beside_the_gain":
        "scripts/run_loadtest.sh end to end against two fake servers; the accuracy tests in process stay fast",
    "test_split_k.py::test_split_gemms_match_the_unsplit_ones_and_repeat_bit_for_bit[[]3]":
        "test_op_bits' fast case runs split K (and the chains) against 00e4ba9's bits",
    "test_two_chains.py::test_eager_calls_run_the_chains_once_then_one_chain":
        "the eager rule in the interpreter; test_op_bits' fast case hashes a shape's first and second eager call",
    # Grids: one or two cases stay fast
    "test_ready_blocks.py::test_op_filling_gemm1s_tail_gives_the_bits_of_its_launches_in_turn[[]80-*": GRID,
    "test_ready_blocks.py::test_op_filling_gemm1s_tail_gives_the_bits_of_its_launches_in_turn[[]16-*": GRID,
    "test_ready_blocks.py::test_op_filling_gemm1s_tail_gives_the_bits_of_its_launches_in_turn[[]6-*": GRID,
    "test_ready_blocks.py::test_gemm1_counts_each_blocks_tiles_and_keeps_its_bits[[]6-*": GRID,
    "test_ready_blocks.py::test_gemm1_counts_each_blocks_tiles_and_keeps_its_bits[[]3-*": GRID,
    "test_ready_blocks.py::test_gemm1_counts_each_blocks_tiles_and_keeps_its_bits[[]1-1-3]": GRID,
    "test_ready_blocks.py::test_gemm2_waiting_for_its_block_gives_the_plain_bits[[]1-2]": GRID,
    "test_ready_blocks.py::test_gemm2_waiting_for_its_block_gives_the_plain_bits[[]3-1]": GRID,
    "test_split_k.py::test_split_gemms_match_the_unsplit_ones_and_repeat_bit_for_bit[[]5]":
        "test_op_bits' fast case runs split K against 00e4ba9's bits",
    "test_split_k.py::test_each_pair_routing_gives_the_sorted_routings_bits[[]2-2]": GRID,
    "test_split_k.py::test_each_pair_routing_gives_the_sorted_routings_bits[[]4-1]": GRID,
    "test_split_k.py::test_each_pair_routing_gives_the_sorted_routings_bits[[]1-0]": GRID,
    "test_split_k.py::test_stream_gemm1_matches_float64_reference_and_repeats[[]T1-*": GRID,
    "test_split_k.py::test_stream_gemm1_matches_float64_reference_and_repeats[[]T2-*": GRID,
    "test_split_k.py::test_stream_gemm1_matches_float64_reference_and_repeats[[]T7-*": GRID,
    "test_split_k.py::test_stream_gemm1_matches_float64_reference_and_repeats[[]T3-*-1]": GRID,
    "test_split_k.py::test_stream_gemm1_matches_float64_reference_and_repeats[[]T3-*-5]": GRID,
    "test_split_k.py::test_stream_gemm1_matches_float64_reference_and_repeats[[]T6-*-1]": GRID,
    "test_split_k.py::test_stream_gemm1_matches_float64_reference_and_repeats[[]T6-*-5]": GRID,
    "test_split_k.py::test_op_with_few_active_experts_matches_float64_reference[[]T6-*": GRID,
    "test_split_k.py::test_op_with_few_active_experts_matches_float64_reference[[]T5-*": GRID,
    "test_split_k.py::test_op_with_few_active_experts_matches_float64_reference[[]T2-*": GRID,
    "test_two_chains.py::test_interleaved_chains_in_turn_match_the_reference_and_one_chain[[]*":
        "test_op_bits' fast case runs interleaved chains against 00e4ba9's bits",
    "test_first_contact.py::test_serve_dry_run_refuses_what_sglang_would_misread_or_refuse[[]an unknown flag]": GRID,
    "test_first_contact.py::test_serve_dry_run_refuses_what_sglang_would_misread_or_refuse[[]an abbreviation *": GRID,
    "test_loadtest_e2e.py::test_measures_injected_latency_and_throughput[[]chat]": GRID,
    "test_two_chains.py::test_chains_in_turn_match_the_reference_and_one_chain[[]4-*": GRID,
    "test_two_chains.py::test_the_op_interleaves_below_the_shipped_threshold_and_takes_halves_above[[]64-*": GRID,
    "test_two_chains.py::test_each_call_runs_the_chains_eagerly_once_even_where_plans_are_equal":
        "the eager rule in the interpreter (see test_eager_calls_run_the_chains_once_then_one_chain)",
    "test_tiles.py::test_model_bounds_the_compiler[[]gemm1-*": "the gemm2 case for sm_120 stays fast",
    "test_tiles.py::test_model_bounds_the_compiler[[]gemm2-h200]": "the gemm2 case for sm_120 stays fast",
    "test_tiles.py::test_the_stream_k_form_takes_no_more_shared_memory_than_the_tile[[]h200]":
        "the sm_120 case stays fast",
    "test_weight_layout.py::test_op_gives_the_same_results_in_every_layout[[]T40-*": GRID,
    "test_weight_layout.py::test_op_gives_the_same_results_in_every_layout[[]T13-*": GRID,
    "test_weight_layout.py::test_op_gives_the_same_results_in_every_layout[[]T17-*": GRID,
    "test_weight_layout.py::test_op_gives_the_same_results_in_every_layout[[]T7-*": GRID,
    "test_w4a4_select.py::test_selfcheck_fails_a_wrong_op[[]scaled]": GRID,
    "test_w4a4_select.py::test_selfcheck_fails_a_wrong_op[[]nan]": GRID,
    "test_moe.py::test_align_matches_torch_reference[[]1025-*": GRID,
    "test_gluon.py::test_a_gluon_config_runs_the_triton_kernel_where_gluon_does_not[[]*-gl-ws]": GRID,
    "test_gluon.py::test_gemm1_with_ready_counters_compiles_one_more_atomic_and_no_more_shared_memory[[]3]": GRID,
}


def exhaustive_entries(nodeid: str) -> list[str]:
    """The entries of EXHAUSTIVE that name this test (its id relative to tests/)."""
    name = nodeid.split("tests/", 1)[-1]
    return [pattern for pattern in EXHAUSTIVE if fnmatch.fnmatchcase(name, pattern)]
