"""The test modules that need no torch import none: collected with ``import torch`` made to fail."""

from __future__ import annotations

import subprocess
import sys

from helpers import REPO

#: Test modules (and, through them, tests/conftest.py and tests/helpers.py) that import no torch.
TORCH_FREE = [
    "cli/test_pack_command.py",
    "cli/test_photos.py",
    "core/test_buffer.py",
    "core/test_checks.py",
    "core/test_init.py",
    "engine/test_batch_plan.py",
    "engine/test_epoch.py",
    "engine/test_epoch_plan.py",
    "engine/test_tuner.py",
    "loaders/isolated/test_shm.py",
    "loaders/test_distributed.py",
    "project/test_layering.py",
    "project/test_line_length.py",
    "project/test_packaging.py",
    "project/test_torch_free.py",
    "sources/test_shard_packing.py",
    "sources/test_source.py",
    "sources/test_storage.py",
    "sources/test_table.py",
]

#: Collects the modules named on the command line with torch blocked (``sys.modules["torch"] = None``
#: makes every ``import torch`` raise ImportError), then checks that no torch module got in.
COLLECT = """
import sys
sys.modules["torch"] = None
import pytest
options = ["--collect-only", "-q", "-p", "no:cacheprovider", "-o", "addopts="]
status = pytest.main([*options, *sys.argv[1:]])
loaded = sorted(name for name, module in sys.modules.items() if name.startswith("torch.") and module)
print("torch modules loaded:", loaded)
sys.exit(status or bool(loaded))
"""


def test_the_modules_that_need_no_torch_are_collected_without_it():
    paths = [f"tests/{name}" for name in TORCH_FREE]
    assert all((REPO / path).is_file() for path in paths), "a module of TORCH_FREE moved"
    result = subprocess.run([sys.executable, "-c", COLLECT, *paths], cwd=REPO, capture_output=True,
                            text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "torch modules loaded: []" in result.stdout
