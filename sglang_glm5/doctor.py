"""``sglang-glm5 doctor``: what to run on the GPU box before serving. One line per check.

Checks: where the package is imported from, GPU and target profile, SGLang / torch / Triton versions
against the tested ones, the optional extras, the ``SGLANG_GLM5_*`` switches (``sglang_glm5.env``), the plugin
found through the ``sglang.srt.plugins`` entry point and its SGLang hook targets present, the shipped and user
caches (entries per file; every JSON file of the user cache that cannot be read, once), on the GPU the tiles its op
may launch through the op's decode check (ahead-of-time compiles under the installed Triton), and the op against
the float64 reference on the GPU. A missing optional part (SGLang, an extra) is a warning naming the extra; a
machine without a GPU skips the GPU checks and says so. Exit status 1 when any check fails. Nothing heavy is
imported at module level.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

OK, WARN, FAIL, SKIP = "ok", "warn", "FAIL", "skip"
ENTRY_POINT_GROUP = "sglang.srt.plugins"
ENTRY_POINT_VALUE = "sglang_glm5.patches:plugin"
# Optional extras a command needs: (extra, modules it brings, the commands that need them).
EXTRAS = (
    ("loadtest", ("locust", "matplotlib"), "loadtest run, loadtest compare"),
    ("router", ("smg",), "router"),
)


def install_hint(extra: str) -> str:
    """How to install an extra: from PyPI and from a checkout."""
    return f'pip install "sglang-glm5[{extra}]" (from a checkout: pip install ".[{extra}]")'


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "doctor",
        help="check this machine before serving: GPU, versions, plugin, caches, a correctness run on the GPU",
        description="One line per check; exit status 1 when any check fails. Without a GPU the GPU checks are "
        "skipped and named, and a missing optional part (SGLang, an extra) is a warning naming what to install.",
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


def nvidia_driver_present() -> bool:
    """True when this machine shows an NVIDIA driver (a device node or nvidia-smi), whatever torch sees."""
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


def check_gpu(no_gpu: bool) -> tuple[str, str]:
    import torch

    if no_gpu:
        return SKIP, "GPU: --no-gpu"
    if not torch.cuda.is_available():
        if nvidia_driver_present():
            return FAIL, (f"GPU: this machine has an NVIDIA driver but torch {torch.__version__} sees no CUDA "
                          "device (a CPU-only torch build, or CUDA_VISIBLE_DEVICES hides them)")  # fmt: skip
        return SKIP, "GPU: none here (torch sees no CUDA device, no NVIDIA driver)"
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
        tested = ", ".join(guard.SUPPORTED_SGLANG_VERSIONS)
        lines.append((WARN, f"sglang: not installed (needed to serve; tested: {tested}): {install_hint('sglang')}"))
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


def check_extras() -> list[tuple[str, str]]:
    """The optional extras other than SGLang (``check_versions``): a missing one is a warning naming it."""
    lines = []
    for extra, modules, commands in EXTRAS:
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            lines.append((WARN, f"extra {extra}: {', '.join(missing)} not installed (needed by {commands}): "
                          f"{install_hint(extra)}"))  # fmt: skip
        else:
            lines.append((OK, f"extra {extra}: {', '.join(modules)} installed"))
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
    if guard.installed_sglang_version() is None:
        lines.append((SKIP, "plugin: SGLang hook targets not checked (SGLang not installed)"))
    elif guard.version_supported(guard.installed_sglang_version()):
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
    from sglang_glm5._files import cache_dir, read_json

    lines = []
    counts = []
    for path in sorted(cache_dir().glob("*.json")) if cache_dir().is_dir() else []:  # the memoized compiles, ...
        try:
            read_json(path)
        except (OSError, ValueError) as e:
            lines.append((WARN, f"cache: {path} cannot be read ({_reason(e, path)}): not used; the next write there "
                          "keeps it aside as NAME.corrupt-<time> and starts a new one"))  # fmt: skip
    for name, folder in (("user", autotune.user_dir()), ("shipped", autotune.shipped_dir())):
        owners: dict[str, int] = {}
        files = sorted(folder.glob("*.json")) if folder.is_dir() else []
        for path in files:
            try:
                data = read_json(path)
            except (OSError, ValueError) as e:
                lines.append((WARN, f"cache: {path} cannot be read ({_reason(e, path)}): skipped by lookups; "
                              "`tune` keeps it aside"))  # fmt: skip
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
        with _quiet(autotune.log):  # the unreadable files are reported above, once
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


def _reason(error: Exception, path: Path) -> str:
    """An error's text without the path the line already names."""
    text = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
    return text.removeprefix(f"{path}: ")


class _quiet:
    """Silences a logger inside ``with``: doctor prints the problems it would log, each once."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.was = logger, logger.disabled

    def __enter__(self) -> None:
        self.logger.disabled = True

    def __exit__(self, *exc) -> None:
        self.logger.disabled = self.was


def target_tiles(target) -> list:
    """The W4A16 Triton tiles the op may launch on ``target`` (a ``hardware.GpuTarget``): its cache entries
    (``autotune.ConfigCache``: the user's files over the shipped ones) and the heuristic's; (kernel, config) pairs."""
    from sglang_glm5 import autotune, variants
    from sglang_glm5.variants import w4a16_tiles

    with _quiet(autotune.log):  # check_cache reports unreadable files
        cache = autotune.ConfigCache(target)
    entries = [(autotune.key_kernel_field(key), e.config) for key, e in cache.entries.items()]
    return w4a16_tiles.launchable_tiles(entries, variants.get("w4a16"))


def check_target_tiles(target, tiles: list) -> tuple[str, str]:
    """``tiles`` (``target_tiles``) compiled ahead of time for the target's architecture under the installed Triton
    (no GPU needed), each within its shared memory per block and through the decode check the op applies at each
    kernel's first launch (``variants.w4a16_pairs``): a tile it refuses would stop a server at its first call of that
    size. Compiles are memoized ($SGLANG_GLM5_CACHE_DIR/aot_shared.json)."""
    import triton

    from sglang_glm5.patches import guard
    from sglang_glm5.variants import w4a16_tiles

    try:
        verdicts = w4a16_tiles.compiled_shared_bytes_many(tiles, target)
    except RuntimeError as e:
        return FAIL, f"tiles: an ahead-of-time compile failed under Triton {triton.__version__}: {e}"
    refused = [f"{k} {c.label}" for (k, c), v in zip(tiles, verdicts, strict=True) if isinstance(v, str)]
    if refused:
        return FAIL, (f"tiles: under Triton {triton.__version__} the op would refuse {len(refused)} of {len(tiles)} "
                      f"tiles at their first launch (a register's two weight words under two scale blocks): "
                      f"{', '.join(refused)}; `sglang-glm5 tune --target local` on that GPU picks others for the "
                      f"cache (tested Triton: {', '.join(guard.TESTED_TRITON_VERSIONS)})")  # fmt: skip
    over = [f"{k} {c.label} ({v} B)" for (k, c), v in zip(tiles, verdicts, strict=True) if not target.fits(v)]
    if over:
        return FAIL, (f"tiles: {len(over)} of {len(tiles)} tiles exceed {target.name}'s {target.shared_per_block} B "
                      f"of shared memory per block: {', '.join(over)}")  # fmt: skip
    return OK, (f"tiles: the {len(tiles)} W4A16 tiles the op may launch on {target.name} compile for {target.sm} "
                f"within its {target.shared_per_block} B of shared memory (largest {max(verdicts)} B) and decode "
                f"under their own block scales (Triton {triton.__version__})")  # fmt: skip


def check_tiles(no_gpu: bool, skip: bool) -> list[tuple[str, str]]:
    """The tiles this GPU's op may launch, through ``check_target_tiles``: before serving, not at a first call."""
    import torch

    if skip:
        return [(SKIP, "tiles: --no-tiles")]
    if no_gpu or not torch.cuda.is_available():
        return [(SKIP, "tiles: needs the GPU that will serve (`sglang-glm5 quickstart` checks the shipped RTX PRO "
                 "6000 tiles without one)")]  # fmt: skip
    from sglang_glm5 import hardware, variants

    target = hardware.detect()
    if not variants.get("w4a16").runs_on(target.arch):
        return [(SKIP, f"tiles: the W4A16 kernels do not run on {target.sm}")]
    tiles = target_tiles(target)
    print(f"[ .. ] tiles: compiling {len(tiles)} W4A16 tiles for {target.sm} (memoized; minutes the first time)",
          flush=True)  # fmt: skip
    return [check_target_tiles(target, tiles)]


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
    from sglang_glm5 import autotune

    with _quiet(autotune.log):  # its lookup reads the cache files check_cache reported
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
        check_extras,
        check_env,
        check_plugin,
        check_cache,
        lambda: check_tiles(args.no_gpu, args.no_tiles),
        lambda: [check_op(args.no_gpu)],
    ]
    failures, skipped, warnings = 0, [], 0
    for check in checks:
        for status, line in check():
            failures += status == FAIL
            warnings += status == WARN
            if status == SKIP:
                skipped.append(line.split(":")[0])
            print(f"[{status:>4}] {line}", flush=True)
    verdict = "all checks passed" if not failures else f"{failures} check(s) FAILED"
    notes = [f"{warnings} warning(s)"] * bool(warnings) + [f"skipped: {', '.join(skipped)}"] * bool(skipped)
    print(f"doctor: {verdict}" + (f" ({'; '.join(notes)})" if notes else ""))
    return 1 if failures else 0
