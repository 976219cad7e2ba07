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
