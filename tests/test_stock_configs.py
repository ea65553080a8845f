"""SM120 configs for SGLang's own Triton fused-MoE kernel, and the plugin's SGLANG_MOE_CONFIG_DIR switch (CPU)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from sglang_glm5 import stock_configs as sc
from sglang_glm5.patches import stock_configs as plug

SHIPPED = sc.shipped_dir()
FILES = sorted(SHIPPED.glob("configs/triton_*/*.json"))


def _expected():
    for _, e, n in sc.SHAPES:
        for dtype in sc.DTYPES:
            for device in sc.DEVICE_NAMES:
                yield e, n, dtype, device


@pytest.fixture(scope="module")
def sg_cfg():
    pytest.importorskip("sglang.srt.plugins", reason="SGLang's modules are not installed")
    from sglang.srt.layers.moe.moe_runner.triton_utils import fused_moe_triton_config as cfg

    return cfg


def test_shipped_set_is_complete():
    names = {p.name for p in FILES}
    assert len(FILES) == len(names) == len(list(_expected()))
    assert (SHIPPED / "README.md").exists()
    meta = json.loads((SHIPPED / sc.META_FILE).read_text())
    assert meta["measured"] is False and meta["shared_limit_bytes"] == 101376
    assert set(meta["files"]) == names


def test_file_names_match_sglang_lookup(sg_cfg, monkeypatch):
    import triton

    for e, n, dtype, device in _expected():
        monkeypatch.setattr(sg_cfg, "get_device_name", lambda device=device: device)
        block = list(sc.BLOCK_SHAPE) if dtype else [0, 0]
        name = sg_cfg.get_config_file_name(e, n, dtype, block)
        assert name == sc.file_name(e, n, dtype, device)
        assert (SHIPPED / "configs" / sc.triton_dir(triton.__version__) / name).exists(), name


def test_files_parse_with_sglang_loader(sg_cfg, monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setenv("SGLANG_MOE_CONFIG_DIR", str(SHIPPED))
    exec_cfg = SimpleNamespace(deterministic=SimpleNamespace(enable_deterministic_inference=False))
    monkeypatch.setattr(sg_cfg, "get_exec", lambda: exec_cfg)  # SGLang's runtime config is not published here
    for e, n, dtype, device in _expected():
        monkeypatch.setattr(sg_cfg, "get_device_name", lambda device=device: device)
        sg_cfg.get_moe_configs.cache_clear()
        block = sc.BLOCK_SHAPE if dtype else (0, 0)
        configs = sg_cfg.get_moe_configs(e, n, dtype, *block)
        assert configs is not None, (e, n, dtype, device)
        assert sorted(configs) == list(sc.M_GRID)
        for cfg in configs.values():
            assert set(cfg) == set(sc.KEYS)
            if dtype:
                assert sc.BLOCK_SHAPE[1] % cfg["BLOCK_SIZE_K"] == 0
    sg_cfg.get_moe_configs.cache_clear()


def _stock_sm90_files() -> list[Path]:
    import sglang.srt.layers.moe.moe_runner.triton_utils as tu

    root = Path(tu.__file__).parent / "configs"
    names = {
        sc.file_name(e, n, d, dev)
        for _, e, n in sc.SHAPES
        for d in sc.DTYPES
        for dev in ("NVIDIA H200", "NVIDIA H100 80GB HBM3")
    }
    return sorted(p for p in root.glob("triton_*/*.json") if p.name in names)


@pytest.fixture(scope="module")
def compiled(sg_cfg):
    """Shared bytes on sm_120 of every distinct shipped config and of every stock H100/H200 config for these
    shapes: one batch of ahead-of-time compiles in one worker process."""
    items: dict[tuple, tuple] = {}
    origin: dict[tuple, str] = {}
    for path in FILES + _stock_sm90_files():
        dtype = "fp8_w8a8" if "dtype=fp8_w8a8" in path.name else None
        for cfg in json.loads(path.read_text()).values():
            cfg = {k: cfg[k] for k in sc.KEYS}
            key = (path.parent.parent == SHIPPED / "configs", dtype, *cfg.values())
            items.setdefault(key, (dtype, cfg))
            origin.setdefault(key, path.name)
    shared = sc.compiled_shared(list(items.values()))
    return {k: (s, origin[k]) for k, s in zip(items, shared, strict=True)}


def test_every_shipped_config_fits_sm120(compiled):
    ours = {k: v for k, v in compiled.items() if k[0]}
    assert ours
    over = {k: v for k, v in ours.items() if v[0] > sc.LIMIT}
    assert not over, over


def test_stock_sm90_configs_for_these_shapes_on_sm120(compiled):
    """Finding (Triton 3.8, SGLang 0.5.23): SGLang's H100/H200 files for these GLM-5 shapes all fit sm_120
    (largest 81920 B), so for them the gain is having SM12x-named files at all (without them SGLang uses its
    default config), not avoiding a launch failure. Fails when that changes, so that the README's status line
    on these configs can be corrected."""
    stock = {k: v for k, v in compiled.items() if not k[0]}
    if not stock:
        pytest.skip("SGLang ships no H100/H200 file for these shapes")
    worst = max(stock.values())
    assert worst[0] <= sc.LIMIT, f"a stock SM90 config exceeds sm_120's limit: {worst}"


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(plug.ENV, raising=False)
    monkeypatch.delenv(plug.SWITCH_ENV, raising=False)
    return monkeypatch


def test_an_out_that_is_a_file_is_named_before_the_compiles(tmp_path, capsys, monkeypatch):
    pytest.importorskip("sglang", reason="stock-configs needs SGLang")
    from sglang_glm5.cli import main

    monkeypatch.setattr(sc, "generate", lambda *a, **k: pytest.fail("compiled before checking --out"))
    (tmp_path / "a_file").write_text("")
    assert main(["stock-configs", "--out", str(tmp_path / "a_file")]) == 2
    assert "a_file: a file; expected a folder" in capsys.readouterr().err


def test_plugin_sets_dir_on_sm12x_only(clean_env, caplog):
    import os

    clean_env.setenv(plug.SWITCH_ENV, "1")
    assert not plug.apply(arch=90) and plug.ENV not in os.environ
    assert not plug.apply(arch=100) and plug.ENV not in os.environ
    with caplog.at_level(logging.INFO, logger="sglang_glm5.patches"):
        assert plug.apply(arch=120)
    assert os.environ[plug.ENV] == str(sc.shipped_dir())
    assert Path(os.environ[plug.ENV], "configs").is_dir()
    assert len([r for r in caplog.records if plug.ENV in r.getMessage()]) == 1
    clean_env.delenv(plug.ENV)
    assert plug.apply(arch=121)


def test_plugin_leaves_user_dir_alone(clean_env):
    import os

    clean_env.setenv(plug.SWITCH_ENV, "1")
    clean_env.setenv(plug.ENV, "/my/configs")
    assert not plug.apply(arch=120)
    assert os.environ[plug.ENV] == "/my/configs"


def test_off_unless_asked_for(clean_env):
    import os

    assert not plug.apply(arch=120) and plug.ENV not in os.environ  # default: SGLang's own folder
    clean_env.setenv(plug.SWITCH_ENV, "0")
    assert not plug.apply(arch=120) and plug.ENV not in os.environ


def test_plugin_entry_point_calls_it(clean_env):
    import os

    from sglang_glm5 import patches

    clean_env.setattr(plug, "detect_arch", lambda: 120)
    clean_env.setattr(patches, "apply", lambda: None)
    clean_env.setenv(plug.SWITCH_ENV, "1")
    patches.plugin()
    assert os.environ[plug.ENV] == str(sc.shipped_dir())
    clean_env.delenv(plug.ENV)
    clean_env.setenv("SGLANG_GLM5_DISABLE", "1")
    patches.plugin()
    assert plug.ENV not in os.environ
