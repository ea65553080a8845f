"""``sglang-glm5 doctor``: what to run on the GPU box before serving. One line per check.

Checks: where the package is imported from, GPU and target profile, SGLang / torch / Triton versions
against the tested ones, the ``SGLANG_GLM5_*`` switches (``sglang_glm5.env``), the plugin found through
the ``sglang.srt.plugins`` entry point and its SGLang hook targets present, the shipped and user config
caches (entries per file, broken files), on the GPU the tiles its op may launch through the op's decode check
(ahead-of-time compiles under the installed Triton), and the op against the float64 reference on the GPU.
Exit status 1 when any check fails. Nothing heavy is imported at module level.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
from collections.abc import Callable
from pathlib import Path

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_VALUE = "sglang_glm5.patches:plugin"


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check this machine before serving: GPU, versions, plugin, caches, a correctness run on the GPU",
        description="One line per check; exit status 1 when any check fails.",
    )
    p.add_argument("--no-gpu", action="store_true", help="skip the GPU checks (a machine without a GPU)")
    p.add_argument(
        "--no-tiles",
        action="store_true",
        help="skip compiling the tiles the op may launch for the decode check (minutes the first time)",
    )
    p.set_defaults(func=run)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_package() -> tuple[str, str]:
    import sglang_glm5

    here = Path(sglang_glm5.__file__).resolve().parent
    if (here / "kernels").is_dir():
        kind = "installed"
    elif (here.parent / "pyproject.toml").is_file():
        kind = "source checkout: an editable install, or Python started in the repository root"
    else:
        return FAIL, f"package: {here} has no kernels/ subpackage (reinstall: pip install sglang-glm5)"
    return OK, f"package: sglang-glm5 {_version('sglang-glm5') or sglang_glm5.__version__} from {here} ({kind})"


def check_env() -> list[tuple[str, str]]:
    from sglang_glm5 import env

    errors, warnings = env.problems()
    lines = [(FAIL, f"env: {e}") for e in errors] + [(WARN, f"env: {w}") for w in warnings]
    shown = [f"{n}=<set>" if env.BY_NAME[n].secret else f"{n}={os.environ[n]}" for n in sorted(os.environ)
             if n in env.BY_NAME]  # fmt: skip
    if not lines:
        lines.append((OK, "env: " + (", ".join(shown) if shown else "no SGLANG_GLM5_* switch set (defaults)")))
    return lines


def check_gpu(no_gpu: bool) -> tuple[str, str]:
    import torch

    if no_gpu:
        return SKIP, "GPU: --no-gpu"
    if not torch.cuda.is_available():
        return FAIL, "GPU: torch sees no CUDA device"
    name = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    profile = "unknown"
    try:
        from sglang_glm5 import hardware

        profile = str(hardware.detect())
    except (ImportError, AttributeError, RuntimeError, ValueError) as e:
        profile = f"unknown ({e})"
    status = OK if (major, minor) >= (8, 0) else FAIL
    return status, f"GPU: {name}, sm{major}{minor}, profile {profile}"


def check_versions() -> list[tuple[str, str]]:
    from sglang_glm5.patches import guard

    lines = []
    sglang = guard.installed_sglang_version()
    if sglang is None:
        lines.append((FAIL, "sglang: not installed"))
    else:
        ok = guard.version_supported(sglang)
        tested = ", ".join(guard.SUPPORTED_SGLANG_VERSIONS)
        lines.append((OK if ok else FAIL, f"sglang {sglang} (supported: {tested})"))
    for dist, tested in (("torch", guard.TESTED_TORCH_VERSIONS), ("triton", guard.TESTED_TRITON_VERSIONS)):
        found = _version(dist)
        base = (found or "").split("+")[0]
        status = FAIL if found is None else (OK if base in tested else WARN)
        lines.append((status, f"{dist} {found or 'not installed'} (tested: {', '.join(tested)})"))
    return lines


def check_plugin() -> list[tuple[str, str]]:
    from sglang_glm5.patches import guard

    eps = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.value == ENTRY_POINT_VALUE]
    if not eps:
        return [(FAIL, f"plugin: no {ENTRY_POINT_GROUP} entry point {ENTRY_POINT_VALUE} (reinstall the package)")]
    lines = [(OK, f"plugin: entry point {eps[0].name} -> {ENTRY_POINT_VALUE}")]
    allowed = os.environ.get("SGLANG_PLUGINS", "")
    if allowed and eps[0].name not in {x.strip() for x in allowed.split(",")}:
        lines.append((FAIL, f"plugin: SGLANG_PLUGINS={allowed!r} leaves out {eps[0].name}"))
    if guard.disabled():
        lines.append((WARN, f"plugin: {guard.DISABLE_ENV} turns the plugin off: SGLang runs stock, and "
                      f"--moe-runner-backend {guard.BACKEND_NAME} is not available"))  # fmt: skip
    if guard.version_supported(guard.installed_sglang_version()):
        from sglang_glm5 import patches

        try:
            patches.check_targets()
            lines.append((OK, "plugin: every hooked SGLang symbol is where the plugin expects it"))
        except patches.PatchTargetError as e:
            lines.append((FAIL, f"plugin: {e}"))
    return lines


def check_cache() -> list[tuple[str, str]]:
    """The autotune entries this GPU reads, through the op's own lookup (``autotune.ConfigCache``: the user's
    files over the shipped ones, found through importlib.resources); without a GPU, what the user's and the
    shipped cache files hold, counted by owner (a device, or an architecture and its shared memory). Files
    that cannot be read are warnings."""
    import torch

    from sglang_glm5 import autotune, hardware

    lines = []
    counts = []
    for name, folder in (("user", autotune.user_dir()), ("shipped", autotune.shipped_dir())):
        owners: dict[str, int] = {}
        files = sorted(folder.glob("*.json")) if folder.is_dir() else []
        for path in files:
            data = autotune.read_cache_file(path)
            if data is None:
                lines.append((WARN, f"cache: {path} cannot be read (skipped by lookups; `tune` keeps it aside)"))
                continue
            raw = data.get("entries")
            for key in raw if isinstance(raw, dict) else ():
                owner = autotune.key_owner(key)
                owners[owner] = owners.get(owner, 0) + 1
        detail = ", ".join(f"{o}: {n}" for o, n in sorted(owners.items()))
        counts.append((name, len(files), sum(owners.values()), detail, folder))
    where = f"{autotune.user_dir()} and {autotune.shipped_dir()}"
    if torch.cuda.is_available():
        target = hardware.detect()
        cache = autotune.ConfigCache(target)
        entries = cache.entries
        own, *borrowed_from, _ = cache.owners  # own measured, siblings' measured, the architecture's unmeasured
        measured = sum(key.startswith(own + "|") for key in entries)
        borrowed = sum(key.startswith(tuple(o + "|" for o in borrowed_from)) for key in entries)
        kin = [t.name for t in autotune.siblings(target)]
        unmeasured = len(entries) - measured - borrowed
        text = (
            f"cache: {len(entries)} entries for {target.name} ({measured} measured on it, "
            + (f"{borrowed} measured on {'/'.join(kin)} (same SMs and shared memory), " if kin else "")
            + f"{unmeasured} unmeasured for {target.sm} with {target.shared_per_block} B) under {where}"
        )
        missing = " (heuristic tiles: `sglang-glm5 tune --target local`)"
        lines.insert(0, (OK, text) if entries else (WARN, text + missing))
        return lines
    text = "cache: no GPU to match; " + "; ".join(
        f"{name} {files} file(s), {entries} entries{f' ({detail})' if detail else ''} under {folder}"
        for name, files, entries, detail, folder in counts
    )
    shipped_entries = counts[1][2]
    missing = " (no shipped caches found: reinstall the package)"
    lines.insert(0, (OK, text) if shipped_entries else (FAIL, text + missing))
    return lines


def check_tiles(no_gpu: bool, skip: bool) -> list[tuple[str, str]]:
    """The W4A16 Triton tiles this GPU's op may launch (its cache entries, ``autotune.ConfigCache``, and the
    heuristic's) compiled ahead of time for its architecture under the installed Triton, through the decode check the
    op applies at each kernel's first launch (``variants.w4a16_pairs``): a tile it refuses would stop a server at its
    first call of that size, which this reports before serving. Compiles are memoized
    ($SGLANG_GLM5_CACHE_DIR/aot_shared.json)."""
    import torch

    if skip:
        return [(SKIP, "tiles: --no-tiles")]
    if no_gpu or not torch.cuda.is_available():
        return [(SKIP, "tiles: needs the GPU that will serve (the tiles its op reads for its architecture)")]
    import triton

    from sglang_glm5 import autotune, hardware, variants
    from sglang_glm5.patches import guard
    from sglang_glm5.variants import w4a16_tiles

    target = hardware.detect()
    variant = variants.get("w4a16")
    if not variant.runs_on(target.arch):
        return [(SKIP, f"tiles: the W4A16 kernels do not run on {target.sm}")]
    entries = [(autotune.key_kernel_field(key), e.config) for key, e in autotune.ConfigCache(target).entries.items()]
    tiles = w4a16_tiles.launchable_tiles(entries, variant)
    print(f"[ .. ] tiles: compiling {len(tiles)} W4A16 tiles for {target.sm} (memoized; minutes the first time)",
          flush=True)  # fmt: skip
    try:
        verdicts = w4a16_tiles.compiled_shared_bytes_many(tiles, target)
    except RuntimeError as e:
        return [(FAIL, f"tiles: an ahead-of-time compile failed under Triton {triton.__version__}: {e}")]
    refused = [f"{k} {c.label}" for (k, c), v in zip(tiles, verdicts, strict=True) if isinstance(v, str)]
    if refused:
        return [(FAIL, f"tiles: under Triton {triton.__version__} the op would refuse {len(refused)} of {len(tiles)} "
                 f"tiles at their first launch (a register's two weight words under two scale blocks): "
                 f"{', '.join(refused)}; `sglang-glm5 tune --target local` picks others for the cache (tested "
                 f"Triton: {', '.join(guard.TESTED_TRITON_VERSIONS)})")]  # fmt: skip
    return [(OK, f"tiles: the {len(tiles)} W4A16 tiles this GPU's op may launch decode under their own block scales "
             f"({target.sm}, Triton {triton.__version__})")]  # fmt: skip


def check_op(no_gpu: bool) -> tuple[str, str]:
    import torch

    if no_gpu or not torch.cuda.is_available():
        return SKIP, "op: needs a CUDA GPU"
    from sglang_glm5.moe import nvfp4_fused_moe
    from sglang_glm5.reference import nvfp4_fused_moe_reference
    from sglang_glm5.testing import random_layer, random_routing

    seed = int.from_bytes(os.urandom(4), "little")
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    layer = random_layer(8, 512, 256, gen, "cuda")
    x = torch.randn(33, 512, generator=gen, device="cuda").bfloat16()
    weights, ids = random_routing(33, 8, 4, gen, remote_fraction=0.2, device="cuda")
    out = nvfp4_fused_moe(x, *layer.args(), weights, ids)
    ref = nvfp4_fused_moe_reference(x, *layer.args(), weights, ids)
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    status = OK if rel < 1e-2 and bool(torch.isfinite(out).all()) else FAIL
    return status, f"op: nvfp4_fused_moe vs float64 reference, E8 H512 I256 T33, rel err {rel:.1e} (seed {seed})"


def run(args: argparse.Namespace) -> int:
    checks: list[Callable[[], list[tuple[str, str]]]] = [
        lambda: [check_package()],
        lambda: [check_gpu(args.no_gpu)],
        check_versions,
        check_env,
        check_plugin,
        check_cache,
        lambda: check_tiles(args.no_gpu, args.no_tiles),
        lambda: [check_op(args.no_gpu)],
    ]
    failures = 0
    for check in checks:
        for status, line in check():
            failures += status == FAIL
            print(f"[{status:>4}] {line}", flush=True)
    print("doctor: " + ("all checks passed" if not failures else f"{failures} check(s) FAILED"))
    return 1 if failures else 0
