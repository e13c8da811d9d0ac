"""The shared Transformer: parameter count of the paper preset, masks and positions."""

import torch

from rlmlab.model import Transformer, preset
from rlmlab.vocab import default_vocab


def test_paper_preset_parameter_count():
    V = len(default_vocab())
    m = Transformer(preset("paper", "rm", V))
    # Counted like the paper (~10.65M): distinct weights, tied embedding once, positional table excluded.
    assert 10.6e6 < m.num_params(include_positions=False) < 10.7e6
    assert m.num_params() - m.num_params(include_positions=False) == 2048 * 384


def test_explicit_causal_mask_equals_is_causal():
    torch.manual_seed(0)
    m = Transformer(preset("tiny", "rm", 59)).eval()
    x = torch.randint(0, 59, (3, 17))
    mask = torch.ones(17, 17, dtype=torch.bool).tril().expand(3, 1, 17, 17)
    torch.testing.assert_close(m(x), m(x, attn_mask=mask), atol=1e-5, rtol=0)
