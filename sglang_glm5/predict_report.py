"""What ``sglang-glm5 plan --predict`` prints: the step model's table by concurrency, the levers, the calibration, and
the MoE layer predicted against a ``bench`` JSON (``plan --predict-moe --against``). The model is ``predict``."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, replace
from pathlib import Path

from sglang_glm5.hardware import TARGETS, GpuTarget
from sglang_glm5.plan import Plan
from sglang_glm5.predict import (
    ANCHORS,
    CONCURRENCY,
    DEFAULT_CONTEXT,
    FITTED,
    GPUS,
    MOE_KERNELS,
    NVFP4_BYTES,
    REVISION,
    Check,
    Options,
    calibration,
    copy_bandwidth,
    fit_constants,
    ours_layer_time,
    predict,
    touched_mean,
    value,
)


def format_calibration(rows: list[Check], fitted: dict[str, float]) -> str:
    lines = [
        f"calibration ({REVISION}; context {int(value('calibration_context'))} tokens; predictions, nothing run on "
        "SM120):",
        f"  fitted: per-step fixed cost {fitted['step_fixed'] * 1e3:.3f} ms, NCCL latency "
        f"{fitted['nccl_latency'] * 1e6:.2f} us a collective",
        f"  {'configuration':<62s} {'published':>9s} {'predicted':>9s} {'error':>7s}  role",
    ]
    for r in rows:
        verdict = r.role if r.role != "prediction" else ("within 20%" if r.ok else "OUTSIDE 20%")
        lines.append(f"  {r.what:<62s} {r.published:9.1f} {r.predicted:9.1f} {r.error:+7.1%}  {verdict}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The report `plan --predict` prints.


def moe_kernel_for(plan: Plan) -> str:
    return "cutlass" if plan.layout.backend == "flashinfer_cutlass" else "ours"


def format_prediction(plan: Plan, opt: Options, concurrency: tuple[int, ...] = CONCURRENCY) -> str:
    steps = [predict(plan, c, opt) for c in concurrency]
    one = [predict(plan, c, replace(opt, oneshot=True)) for c in concurrency]
    mtp = plan.layout.draft_layers
    head = (f"  predicted decode step ({REVISION}; a prediction: nothing here ran on SM120): {plan.model_name} under "
            f"{plan.profile.name} on {opt.gpu}, context {opt.context:,} tokens, MoE {opt.moe}, NCCL collectives"
            + (f", MTP {plan.spec_steps} draft steps at acceptance {opt.accept:g}" if mtp else ""))  # fmt: skip
    cols = "".join(f"{f'c={c}':>9s}" for c in concurrency)
    lines = [head, f"    {'ms per step':<26s}{cols}"]
    for i, part in enumerate(steps[0].parts):
        lines.append(f"    {part.name:<26s}" + "".join(f"{s.parts[i].seconds * 1e3:9.2f}" for s in steps))
    lines.append(f"    {'step':<26s}" + "".join(f"{s.seconds * 1e3:9.2f}" for s in steps))
    lines.append("    dominant part: " + ", ".join(f"c={s.concurrency} {s.dominant().name} "
                                              f"({s.dominant().seconds / s.seconds:.0%})" for s in steps))  # fmt: skip
    if mtp:
        lines.append(f"    {'tokens a step, a user':<26s}" + "".join(f"{s.tokens_per_step:9.2f}" for s in steps))
    lines.append(f"    {'tok/s per user':<26s}" + "".join(f"{s.tok_s_user:9.1f}" for s in steps))
    lines.append(f"    {'tok/s in total':<26s}" + "".join(f"{s.tok_s_total:9.1f}" for s in steps))
    lines.append(f"    {'  one-shot all-reduce':<26s}" + "".join(f"{s.tok_s_total:9.1f}" for s in one))
    return "\n".join(lines)


def levers(plan: Plan, opt: Options) -> list[tuple[str, Plan, Options]]:
    """What a user could change, each alone: (what, the plan, the options) to predict against the plan as it is."""
    lay = plan.layout
    out = []
    if opt.moe != "cutlass":
        out.append(("MoE: FlashInfer CUTLASS (the stock backend)", plan, replace(opt, moe="cutlass")))
    if opt.moe != "ours":
        out.append(("MoE: ours (nvfp4_triton)", plan, replace(opt, moe="ours")))
    out.append(("MoE at its bytes floor (no kernel does better)", plan, replace(opt, moe="floor")))
    out.append(("one-shot all-reduce below its crossover (sglang #32479)", plan, replace(opt, oneshot=True)))
    other_dp = 1 if lay.attn_dp > 1 else 4
    if lay.tp % other_dp == 0:
        dp_plan = replace(plan, layout=replace(lay, attn_dp=other_dp))
        out.append((f"attention DP {other_dp} (-- --attn-dp-size {other_dp})", dp_plan, opt))
    if plan.kv_dtype != "fp8_e4m3":
        out.append(("FP8 KV cache (-- --kv-cache-dtype fp8_e4m3)", replace(plan, kv_dtype="fp8_e4m3"), opt))
    fitted = {**dict(opt.fitted), "step_fixed": 0.0}
    out.append(("no per-step fixed cost (a full decode graph's bound, sglang #29580)", plan,
                replace(opt, fitted=tuple(fitted.items()))))  # fmt: skip
    return out


def format_levers(plan: Plan, opt: Options, concurrency: tuple[int, ...] = (1, 32)) -> str:
    base = [predict(plan, c, opt).tok_s_total for c in concurrency]
    cols = "".join(f"{f'c={c}':>16s}" for c in concurrency)
    lines = [f"    {'what moves tok/s in total (each alone)':<66s}{cols}",
             f"    {'as planned':<66s}" + "".join(f"{b:16.1f}" for b in base)]  # fmt: skip
    for what, lplan, lopt in levers(plan, opt):
        got = [predict(lplan, c, lopt).tok_s_total for c in concurrency]
        lines.append(
            f"    {what:<66s}" + "".join(f"{g:8.1f} ({g / b - 1:+4.0%})" for g, b in zip(got, base, strict=True))
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# The MoE part against a `bench` JSON of ours.


@dataclass(frozen=True)
class MoeRow:
    layout: str
    batch: int
    touched_model: float
    touched_measured: float | None
    predicted_ms: float
    measured_ms: float

    @property
    def error(self) -> float:
        return self.predicted_ms / self.measured_ms - 1


MOE_LINE = 0.15  # the largest error `--predict-moe` passes


def compare_moe(payload: object, gpu: GpuTarget, max_batch: int = 256) -> tuple[list[MoeRow], int]:
    """Predicted against measured per row of a ``sglang-glm5 bench`` JSON (uniform real routing, B <= max_batch), at
    the experts the row's routings touched (the expectation where the row lacks them); and how many rows were left
    out (skewed routing, larger B, unknown layouts or fields)."""
    from sglang_glm5.bench_real import GLOBAL_EXPERTS, LAYOUTS, TOP_K  # the layouts the bench rows name

    rows = payload.get("rows") if isinstance(payload, dict) else payload
    if not isinstance(rows, list):
        raise ValueError("bench JSON: expected {'rows': [...]} or a list of rows (sglang-glm5 bench --routing real)")
    out, skipped = [], 0
    for r in rows:
        if not isinstance(r, dict):
            skipped += 1
            continue
        layout, batch, ms, skew = r.get("layout"), r.get("batch"), r.get("ms_ours"), r.get("skew", 0)
        if layout not in LAYOUTS or not isinstance(batch, int) or not isinstance(ms, (int, float)) or skew:
            skipped += 1
            continue
        if batch > max_batch or ms <= 0:
            skipped += 1
            continue
        shape = LAYOUTS[layout]
        local = shape.num_experts
        touched = touched_mean(batch, local, GLOBAL_EXPERTS, TOP_K)
        measured = r.get("active_experts")
        measured = float(measured) if isinstance(measured, (int, float)) and measured > 0 else None
        # The row's own routings touched ``measured`` experts: the kernel model is judged on those, not on the
        # expectation's sampling error (16 routings a row).
        expert_bytes = 3 * shape.hidden * shape.inter * NVFP4_BYTES
        slots = batch * TOP_K * local / GLOBAL_EXPERTS
        t = ours_layer_time(gpu, layout, batch, measured or touched, expert_bytes, slots)
        out.append(MoeRow(layout, batch, touched, measured, t * 1e3, float(ms)))
    return out, skipped


def gpu_of(payload: object) -> str | None:
    """The TARGETS name of the GPU a bench JSON was recorded on, when its environment names a known device."""
    env = payload.get("environment", {}) if isinstance(payload, dict) else {}
    name = env.get("gpu") if isinstance(env, dict) else None
    return next((t.name for t in TARGETS.values() if t.device_name == name), None)


def format_moe(rows: list[MoeRow], skipped: int, gpu: GpuTarget, where: str, line: float = MOE_LINE) -> str:
    lines = [
        f"MoE layer, predicted ({REVISION}: H200 record at 00e4ba9 scaled to {gpu.name}'s "
        f"{copy_bandwidth(gpu) / 1e12:.2f} TB/s copy bandwidth and {gpu.sm_count} SMs) against {where}:",
        f"  {'layout':<6s} {'B':>4s} {'touched (model)':>15s} {'measured':>8s} {'predicted us':>12s} "
        f"{'measured us':>11s} {'error':>7s}",
    ]
    for r in rows:
        meas = "-" if r.touched_measured is None else f"{r.touched_measured:.1f}"
        lines.append(f"  {r.layout:<6s} {r.batch:4d} {r.touched_model:15.1f} {meas:>8s} {r.predicted_ms * 1e3:12.1f} "
                     f"{r.measured_ms * 1e3:11.1f} {r.error:+7.1%}")  # fmt: skip
    if rows:
        worst = max(rows, key=lambda r: abs(r.error))
        verdict = "within" if abs(worst.error) <= line else "OUTSIDE"
        lines.append(
            f"  largest error {worst.error:+.1%} ({worst.layout} B = {worst.batch}): {verdict} {line:.0%}"
            f"; {len(rows)} rows compared, {skipped} left out (skewed routing, B > 256, other fields)"
        )
    else:
        lines.append(f"  no row to compare ({skipped} left out): expected uniform real-routing rows of ep8 / tp8")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# Command line: options of `plan` (and the lines of `serve --dry-run`).


def options_for(plan: Plan, gpu: str | None = None, context: int | None = None, accept: float | None = None,
                moe: str | None = None) -> Options:  # fmt: skip
    """The prediction's options for ``plan``: the profile's GPU and MoE backend unless named."""
    name = gpu or plan.profile.gpu
    if name not in GPUS:
        raise ValueError(f"--gpu: the step model knows {', '.join(GPUS)}; profile {plan.profile.name} names {name!r}")
    return Options(gpu=name, moe=moe or moe_kernel_for(plan), context=context or DEFAULT_CONTEXT,
                   accept=value("mtp_accept") if accept is None else accept)  # fmt: skip


def prediction_lines(plan: Plan, opt: Options, concurrency: tuple[int, ...] = CONCURRENCY) -> str:
    if plan.profile.nnodes > 1:
        return (f"  predicted decode step: none for {plan.profile.name} ({plan.profile.nnodes} nodes): the step "
                "model's collectives are one host's PCIe NCCL")  # fmt: skip
    anchors = "; ".join(f"{what} {lo:,g}" + (f"-{hi:,g}" if hi != lo else "") for what, (lo, hi) in ANCHORS.items())
    head = "    published anchors, tok/s in total (TP8, another stack): "
    return f"{format_prediction(plan, opt, concurrency)}\n{head}{anchors}\n{format_levers(plan, opt)}"


def dry_run_lines(plan: Plan) -> str:
    """``serve --dry-run``'s prediction: the profile's GPU, MoE backend, and the default context and acceptance."""
    try:
        opt = options_for(plan)
    except ValueError as e:
        return f"  predicted decode step: none ({e})"
    return prediction_lines(plan, opt)


def _fraction(text: str) -> float:
    try:
        x = float(text)
    except ValueError:
        x = -1.0
    if not 0 <= x <= 1:
        raise argparse.ArgumentTypeError(f"expected an acceptance rate between 0 and 1, got {text!r}")
    return x


def add_cli(subparsers) -> None:
    """The step model's options on ``plan`` (registered after it: ``cli._COMMAND_MODULES``)."""
    from sglang_glm5.cli import int_list

    p = subparsers.choices.get("plan")
    if p is None:
        raise ValueError("predict_report.add_cli: the 'plan' command must be registered before it")
    g = p.add_argument_group("step-time model (predictions; every constant and its source in docs/predict.md)")
    g.add_argument("--predict", action="store_true",
                   help="the predicted decode step by part at concurrency 1-64, tok/s per user and in total, and what "
                   "moves it (with --context: the request's context; default 1,280 tokens)")  # fmt: skip
    g.add_argument(
        "--concurrency",
        type=int_list,
        default=list(CONCURRENCY),
        help="with --predict: running requests to predict (default 1,4,8,16,32,64)",
    )
    g.add_argument("--gpu", choices=GPUS, default=None, help="the GPU of the prediction (default: the profile's)")
    g.add_argument(
        "--mtp-accept",
        type=_fraction,
        default=None,
        help="with --mtp: accepted draft tokens / drafted (default 0.64, the published 3-step rate)",
    )
    g.add_argument(
        "--moe-kernel",
        choices=MOE_KERNELS,
        default=None,
        help="the MoE kernel of the prediction (default: cutlass under flashinfer_cutlass, else ours)",
    )
    g.add_argument(
        "--calibrate",
        action="store_true",
        help="refit the two constants on the published tables and print published, predicted, error",
    )
    g.add_argument("--predict-moe", action="store_true",
                   help="our MoE layer predicted for --gpu (default: the JSON's GPU) against --against's rows; exit 1 "
                   "when a row is more than 15%% off")  # fmt: skip
    g.add_argument(
        "--against",
        default=None,
        metavar="BENCH_JSON",
        help="with --predict-moe: a JSON written by `sglang-glm5 bench --routing real`",
    )
    plan_run = p.get_default("func")
    p.set_defaults(func=lambda args: run(args, plan_run))


def run(args: argparse.Namespace, plan_run) -> int:
    if args.calibrate:
        fitted = fit_constants()
        print(format_calibration(calibration(fitted), fitted))
        shipped = ", ".join(f"{k} {v:.4g}" for k, v in FITTED.items())
        print(f"  shipped constants: {shipped} (the fit above is what predictions use once copied there)")
        return 0
    if args.predict_moe:
        if not args.against:
            raise ValueError("--predict-moe: expected --against BENCH_JSON (from `sglang-glm5 bench`)")
        path = Path(args.against)
        try:
            payload = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"--against {path}: cannot read it as JSON ({e})") from None
        name = args.gpu or gpu_of(payload)
        if name is None:
            raise ValueError(f"--against {path}: its environment names no GPU of {', '.join(GPUS)}; give --gpu")
        gpu = TARGETS[name]
        rows, skipped = compare_moe(payload, gpu)
        print(format_moe(rows, skipped, gpu, str(path)))
        return 0 if rows and all(abs(r.error) <= MOE_LINE for r in rows) else 1
    rc = plan_run(args)
    if rc == 0 and args.predict:
        from sglang_glm5.plan import plan_from_args

        plan = plan_from_args(args)
        opt = options_for(plan, args.gpu, args.context, args.mtp_accept, args.moe_kernel)
        print(prediction_lines(plan, opt, tuple(args.concurrency)))
    return rc
