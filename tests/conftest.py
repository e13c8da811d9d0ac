import random

import pytest

from rlmlab.sampler import ExpressionSampler


def sample_expressions(n: int, seed: int):
    sampler, rng = ExpressionSampler(), random.Random(seed)
    return [sampler.sample(rng) for _ in range(n)]


@pytest.fixture(scope="session")
def random_exprs():
    """1,000 expressions from the paper's generator (seed 0)."""
    return sample_expressions(1000, 0)
