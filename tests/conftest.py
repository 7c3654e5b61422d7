import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests/npu_testing.py, shared helpers

ROOT = Path(__file__).resolve().parent.parent


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
