import random

import pytest
import torch

from rlmlab.task.sampler import ExpressionSampler


def sample_expressions(n: int, seed: int):
    sampler, rng = ExpressionSampler(), random.Random(seed)
    return [sampler.sample(rng) for _ in range(n)]


@pytest.fixture(scope="session")
def random_exprs():
    """1,000 expressions from the paper's generator (seed 0)."""
    return sample_expressions(1000, 0)


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a shared machine a busy core
    stalls every op of a two-thread run (10-30x slower); restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Recorder:
    """Wraps a ModelPredictor: keeps each step's feeds (copied) and logits."""

    def __init__(self, inner):
        self.inner, self.block_size, self.log = inner, inner.block_size, []

    def reset(self, n_slots):
        self.inner.reset(n_slots)

    def __call__(self, feeds):
        out = self.inner(feeds)
        self.log.append(([(f.slot, list(f.seq)) for f in feeds], self.inner.logits.clone()))
        return out
