"""rlmlab, shortcuts: the planted shortcuts of the paper's shortcut table (six constructions, two
excluded ablations), the checks that keep them valid, their data sets and the shortcut rate.

Each construction pairs a training distribution, on which a planted signal S(x) equals the
answer, with an OOD distribution that keeps the same recursive sub-expressions and breaks
that equality. S is read from the executed flattened trace (what CoT reads).

One concept per module:

- `trace`: reading an executed trace (its frame tree, internal returns, RM's root frame).
- `construction`: what a construction is (`Construction`, `Candidate`) and the sampler that
  draws its examples (`ShortcutConfig`, `ShortcutSampler`).
- one module per construction family: `copy_deep_return` (Case 1, with the one-to-one
  ablation), `hidden_literal`, `aggregates` (long-range, near-answer, position-weighted, with
  the sibling-copy ablation), `position_parity` (Case 2).
- `registry`: the constructions by name (`CONSTRUCTIONS`, `VARIANTS`, `ABLATIONS`, `get_construction`).
- `validity`: checks a, b and c, which every built data set must pass.
- `dataset`: `build_shortcut_dataset` and `ShortcutDataset`, saved as parquet tables and
  `shortcut.json`.
- `metric`: the shortcut rate (`shortcut_rate`, `shortcut_summary`).

The experiment that trains and evaluates both learners on these sets is
`rlmlab.experiments.kinds.shortcuts`.
"""

from rlmlab.shortcuts.construction import (
                                           TAIL_RECURSIVE,
                                           Candidate,
                                           Construction,
                                           ShortcutConfig,
                                           ShortcutSampler,
                                           tail_recursive,
)
from rlmlab.shortcuts.dataset import N_IID, N_OOD, N_VAL, ShortcutDataset, build_shortcut_dataset
from rlmlab.shortcuts.metric import shortcut_rate, shortcut_summary
from rlmlab.shortcuts.registry import ABLATIONS, CONSTRUCTIONS, EXPERIMENT_CONSTRUCTIONS, VARIANTS, get_construction
from rlmlab.shortcuts.root_frame import (
                                           RootFrame,
                                           TraceFrame,
                                           answer_position,
                                           child,
                                           frame_tree,
                                           internal_returns,
                                           root_frame,
                                           root_payload,
)
from rlmlab.shortcuts.validity import (
                                           CheckResult,
                                           ValidityLimits,
                                           ValidityReport,
                                           ambiguity,
                                           check_identifiable,
                                           check_no_static_literal,
                                           check_not_one_to_one,
                                           check_validity,
)

__all__ = ["CONSTRUCTIONS", "VARIANTS", "EXPERIMENT_CONSTRUCTIONS", "ABLATIONS", "TAIL_RECURSIVE", "tail_recursive", "Construction", "Candidate", "ShortcutSampler",
           "ShortcutConfig", "ValidityLimits", "TraceFrame", "frame_tree", "internal_returns", "child",
           "answer_position", "RootFrame", "root_frame", "root_payload", "CheckResult", "ValidityReport",
           "check_validity", "check_identifiable", "check_not_one_to_one", "check_no_static_literal",
           "ambiguity", "ShortcutDataset", "build_shortcut_dataset", "get_construction", "shortcut_rate",
           "shortcut_summary", "N_IID", "N_OOD", "N_VAL"]
