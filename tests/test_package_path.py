"""The checkout's root is the package npu_ep, so ``python -m npu_ep...`` run in the checkout (as the README does)
puts the package's own folder on sys.path, where its subpackages (kernels, ep, tools, models, ...) would shadow
installed top-level packages of the same name: transformers 5 imports Hugging Face's ``kernels`` and failed with
ours. ``import npu_ep`` takes that folder off sys.path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_importing_npu_ep_in_the_checkout_leaves_no_subpackage_importable_as_top_level():
    code = ("import importlib.util, sys\n"
            "before = importlib.util.find_spec('kernels')\n"
            "import npu_ep\n"
            "after = importlib.util.find_spec('kernels')\n"
            "print(before is not None and before.origin == sys.argv[1],\n"
            "      after is not None and after.origin == sys.argv[1])\n")
    ours = str(ROOT / "kernels" / "__init__.py")
    done = subprocess.run([sys.executable, "-c", code, ours], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "False"]  # ours was found from the checkout before, not after
