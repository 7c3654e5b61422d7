import os
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _avx512_host() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512dq", "avx512vl"))


# The differential tests compare our GEMMs (and the reference model's column halves of a product) with numpy's
# matmul bit for bit where both sum each output in k order, as OpenBLAS's SkylakeX kernels (its own choice on
# AVX-512 hosts) do. A host may force others (one of ours sets OPENBLAS_CORETYPE=Haswell, whose sums differ in the
# last bit with the blocking), so on every AVX-512 host the tests run the SkylakeX kernels: set before numpy loads;
# subprocesses inherit it.
if _avx512_host() and "numpy" not in sys.modules:
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX"

# The repository root is the package npu_ep. On sys.path (``python -m pytest`` puts the working directory there) its
# subpackages would also be top-level packages shadowing installed ones of the same name: transformers imports
# Hugging Face's ``kernels`` and got ours. Tests reach their helpers as ``tests.<module>`` through an alias instead.
sys.path[:] = [p for p in sys.path if Path(p or os.getcwd()).resolve() != ROOT]
_tests = types.ModuleType("tests")
_tests.__path__ = [str(ROOT / "tests")]
sys.modules.setdefault("tests", _tests)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/npu_testing.py, shared helpers


class _RootIsAFolder:
    """The repository root is the package ``npu_ep`` whatever its checkout folder is called: collect it as a plain
    folder, not as a package named after that folder (a clone in ``/tmp/tmp.XyZ`` would fail every test's setup
    importing a package called ``tmp.XyZ``). Registered as a plugin: a conftest's own hooks do not reach the folder
    above it."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_collect_directory(self, path: Path, parent: pytest.Collector) -> pytest.Collector | None:
        return pytest.Dir.from_parent(parent, path=path) if path == ROOT else None


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_RootIsAFolder(), "npu_ep_root_is_a_folder")
