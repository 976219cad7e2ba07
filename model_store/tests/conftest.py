import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

# Two cores: keep torch to one thread per test process.
torch.set_num_threads(1)

REPO = os.path.dirname(os.path.dirname(HERE))
VECTORS = os.path.join(REPO, "tests", "data", "tokenizer_vectors.json")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# scripts/test.sh runs this suite on two workers (pytest -n 2 --maxschedchunk 1), which take tests in
# collection order, one at a time. Collected as written, the longest test (the native variants: four
# package compiles, two minutes with empty caches) came last and ran alone while the other worker sat
# idle. The tests that compile native packages (test_pt2.py) go first, that one at their head; the
# short ones fill in behind them on whichever worker is free.
def pytest_collection_modifyitems(items):
    def weight(item):
        if item.name.startswith("test_native_variants_are_written_beside_the_portable_package"):
            return 0
        return 1 if item.path.name == "test_pt2.py" else 2

    items.sort(key=weight)  # stable: within each group, the order as collected
