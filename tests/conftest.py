"""Kernels run on the CPU through the Triton interpreter unless a GPU is there (SGLANG_GLM5_TEST_DEVICE).

Every test runs with a temporary ``SGLANG_GLM5_CACHE_DIR`` (one per session, so ahead-of-time compiles are
memoized across tests; removed at the end): the suite never writes to the user's ``~/.cache/sglang_glm5``.
Tests that need an empty cache set their own.
"""

import os
import shutil
import tempfile

import pytest
import tiers
import torch

from sglang_glm5 import env

_COLLECTED = pytest.StashKey[list]()

# Set before any module decorates a kernel: triton.jit reads it at decoration time.
if env.get(env.TEST_DEVICE) == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

_SESSION_CACHE = tempfile.mkdtemp(prefix="sglang_glm5_test_cache_")
os.environ[env.CACHE_DIR.name] = _SESSION_CACHE  # subprocesses the tests start inherit it


def pytest_unconfigure(config):
    shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


@pytest.fixture
def device() -> torch.device:
    return torch.device(env.get(env.TEST_DEVICE))


@pytest.fixture
def gen(request) -> torch.Generator:
    """A generator with a fresh seed, printed so that a failure can be replayed (SGLANG_GLM5_SEED)."""
    seed = env.get(env.SEED)
    if seed is None:  # SGLANG_GLM5_SEED=0 is a seed like any other
        seed = int.from_bytes(os.urandom(4), "little")
    print(f"{request.node.name}: seed {seed}")
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@pytest.fixture(scope="module")
def sglang_with_plugin():
    """SGLang's plugins loaded the way SGLang loads them (``load_plugins``), ours applied; SGLang's
    ``prepare_server_args``. Skips where SGLang's modules are not installed (scripts/dev_setup.sh)."""
    pytest.importorskip("sglang.srt.plugins", reason="SGLang's modules are not installed (scripts/dev_setup.sh)")
    import sglang.srt.plugins as plugins
    from sglang.srt.server_args import prepare_server_args

    from sglang_glm5 import patches

    saved = plugins._plugins_loaded
    plugins._plugins_loaded = False
    plugins.load_plugins()
    assert patches.is_applied(), "load_plugins() did not apply the sglang_glm5 plugin"
    yield prepare_server_args
    plugins._plugins_loaded = saved


def pytest_addoption(parser):
    parser.addoption("--tier", choices=("fast", "exhaustive", "all"), default="fast",
                     help="fast (default): every behaviour once; exhaustive: the slower cases tests/tiers.py lists; "
                          "all: both")


def pytest_collection_modifyitems(config, items):
    """Keeps the tier asked for (tests/tiers.py); the ids of every collected test are kept for test_tiers."""
    config.stash[_COLLECTED] = [item.nodeid for item in items]
    tier = config.getoption("--tier")
    if tier == "all":
        return
    keep, drop = [], []
    for item in items:
        in_exhaustive = bool(tiers.exhaustive_entries(item.nodeid))
        (keep if in_exhaustive == (tier == "exhaustive") else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def collected_ids(request) -> list[str]:
    """The ids of every test this session collected, before the tier was chosen."""
    return request.config.stash[_COLLECTED]
