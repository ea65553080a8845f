"""The real-routing bench's pieces that need no GPU: the routing it draws, the timing in turn, the table row."""

import pytest
import torch

from sglang_glm5 import bench_real


def test_the_op_and_bf16_are_timed_in_turn_so_drift_reaches_both():
    # A machine that slows down 2% from one timing to the next: timed in turn, each round's ratio stays within 2% of
    # the true 2.0; five timings of one, then five of the other, would put the medians' ratio at 2.19.
    clock = iter(range(100))
    calls = []

    def timer(fn):
        calls.append(fn())
        return (1.0 if calls[-1] == "ours" else 2.0) * (1 + 0.02 * next(clock))

    times = bench_real.time_in_turn({"ours": lambda: "ours", "bf16": lambda: "bf16"}, 5, timer)
    assert calls == ["ours", "bf16"] * 5
    assert [len(v) for v in times.values()] == [5, 5]
    ratio = [b / o for o, b in zip(times["ours"], times["bf16"], strict=True)]
    assert all(1.99 < r < 2.05 for r in ratio), ratio
    with pytest.raises(ValueError, match="rounds must be at least 1, got 0"):
        bench_real.time_in_turn({"ours": lambda: None}, 0, timer)


def test_a_row_timed_in_rounds_shows_its_median_ratio_and_range():
    row = bench_real.Row("ep8", 0.0, 8192, 8102.0, 32.0, 1.6, 2.0, 0.2, False, 3e-3, 7, [1.1, 1.3, 1.25])
    line = bench_real.fmt(row)
    assert "| 1.25x (1.10-1.30) |" in line and "| eager, 7 rounds in turn |" in line
    single = bench_real.Row("tp8", 0.0, 2048, 2048.0, 256.0, 1.0, 0.9, 0.1, False, 3e-3)
    assert "| 0.90x |" in bench_real.fmt(single) and bench_real.fmt(single).endswith("| eager |")


@pytest.mark.parametrize("layout", ["ep8", "tp8"])
def test_real_routing_keeps_this_ranks_experts_and_marks_the_rest(layout, gen):
    # 8 of 256 experts per token: EP8 rank 0 sees ids 0-31 and -1 for the rest; TP8 sees every expert.
    spec = bench_real.LAYOUTS[layout]
    weights, ids = bench_real.real_routing(64, spec, gen)
    assert ids.shape == weights.shape == (64, bench_real.TOP_K) and ids.dtype == torch.int32
    valid = ids[ids >= 0]
    assert int(valid.max()) < spec.num_experts and bool(((ids >= 0) | (ids == -1)).all())
    if layout == "tp8":
        assert int((ids < 0).sum()) == 0
    else:  # an eighth of 512 slots (64 on average) land on this rank's 32 of 256 experts
        assert 20 < valid.numel() < 120
    torch.testing.assert_close(weights.sum(-1), torch.full((64,), bench_real.ROUTED_SCALING))
