"""What every experiment's report shares: the fitting rule, learner labels, formatting and saved
results (what a run's training log says, and whether it fitted: `training_log`). Pure functions
of saved files; nothing here imports torch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from rlmlab.errors import ConfigError, DataError
from rlmlab.experiments.refs import job_runs, run_path
from rlmlab.learning.learner import PAPER_LEARNERS, get_learner
from rlmlab.measuring.result_files import find_eval_dir, has_results, read_results
from rlmlab.runlog import has_metrics
from rlmlab.safeio import read_json

if TYPE_CHECKING:
    from rlmlab.learning.config import ModelSettings

# Best validation final-answer accuracy from which a learner counts as having fitted its training
# distribution: the paper reports out-of-domain accuracy only from this plateau on.
FIT_THRESHOLD = 0.99

# The paper's two learners in the same colours on the accuracy figures of every kind; other
# learners take matplotlib's cycle.
LEARNER_COLORS = {"rm": "#1f5fa8", "cot": "#c0392b"}


# A learner with its own position encoding ("cot@rope") is drawn in its base learner's colour, dashed.
ENCODING_LINES = {"none": ":", "rope": "--", "alibi": "-."}


def learner_line(name: str) -> tuple[str | None, str]:
    """(colour, line style) of a learner on the accuracy figures: the paper's learners in their
    colours, a learner with another encoding in its base learner's colour and a style of its own,
    any other learner in matplotlib's cycle (None)."""
    try:
        who = get_learner(name)
    except ConfigError:
        return None, "-"
    return LEARNER_COLORS.get(who.base), ENCODING_LINES.get(who.encoding, "-")


def fitted(best_validation: float | None) -> bool:
    """Whether a learner whose best validation final-answer accuracy is this reached the plateau."""
    return best_validation is not None and best_validation >= FIT_THRESHOLD - 1e-9


def unfit_label(best: float | None) -> str:
    """The label a learner's out-of-domain diagnostics carry when it did not fit; empty if it did."""
    return "" if fitted(best) else f", not fitted (best validation {pct(best)})"


def learner_label(name: str) -> str:
    """Table label of a learner: "RM", "CoT", or its name (also for a folder whose name this
    version does not know)."""
    try:
        return get_learner(name).label
    except ConfigError:
        return name


def model_shape(model: ModelSettings, name: str) -> dict:
    """Layers, heads and width of the model a run's settings describe: its own sizes where set,
    else its preset's for the learner `name` (the "cot" column for a learner this version does
    not know)."""
    from rlmlab.learning.config import MODEL_PRESETS

    try:
        family = get_learner(name).observation.family
    except ConfigError:
        family = "cot"
    base = MODEL_PRESETS[model.preset].get(family, {})
    return {k: getattr(model, k) if getattr(model, k) is not None else base.get(k) for k in ("n_layer", "n_head", "n_embd")}


def shape_label(shape: dict) -> str:
    """"3L/8H/128": layers, heads, width."""
    return f"{shape['n_layer']}L/{shape['n_head']}H/{shape['n_embd']}"


def learners(out: Path, jobs: list[str]) -> list[str]:
    """The learners with a run folder in any of `jobs`: RM and CoT first, then the rest by name,
    so that a third learner run with `rlmlab run --learners` gets its own rows."""
    found = {name for job in jobs for name, d in job_runs(out, job).items() if (d / "eval").is_dir()}
    return paper_order(found)


def save_figure(fig, path: Path) -> None:
    """Figures without a creation date, so that re-running a report rewrites identical files."""
    meta = {"CreationDate": None} if path.suffix == ".pdf" else {"Software": None}
    fig.savefig(path, dpi=150, metadata=meta)


def save_figures(fig, stem: Path) -> None:
    """`fig` as `stem`.png and `stem`.pdf (`save_figure`), then closed."""
    import matplotlib.pyplot as plt

    for ext in ("png", "pdf"):
        save_figure(fig, stem.with_suffix(f".{ext}"))
    plt.close(fig)


def paper_order(names) -> list[str]:
    return [v for v in PAPER_LEARNERS if v in names] + sorted(set(names) - set(PAPER_LEARNERS))


def training_runs(out: Path, job: str) -> dict[str, Path]:
    """Every run folder of `job` with a learning curve, finished or not (RM and CoT first),
    its own or one its experiment folder refers to (`rlmlab.experiments.refs`)."""
    found = {name: d for name, d in job_runs(out, job).items() if has_metrics(d)}
    return {v: found[v] for v in paper_order(found)}


def eval_results(out: Path, job: str, name: str, set_name: str) -> list[dict] | None:
    path = find_eval_dir(run_path(out, job, name), set_name)
    return read_results(path) if has_results(path) else None


_SCALAR = (str, int, float, type(None))  # bool is an int
_RATE = (int, float, type(None))
# What the reports read of each entry of a probe's `groups` and of a frame table's `rows`; a
# name ending in "?" may be absent (a probe run with --positions-only has no answer rate).
SAVED_FIELDS = {
    "probe": {"group_by": (str, type(None)), "group": _SCALAR, "n_expressions": (int,), "position_rate": _RATE,
              "answer_rate?": _RATE},
    "frames": {"group_by": (str, type(None)), "group": _SCALAR, "fn": (str,), "seen": (bool, type(None)),
               "n": (int,), "rate": _RATE},
}


def _fields_ok(entry: dict, fields: dict) -> bool:
    for name, types in fields.items():
        key = name.rstrip("?")
        if key not in entry:
            if name.endswith("?"):
                continue
            return False
        value = entry[key]
        if not isinstance(value, types) or (isinstance(value, float) and not math.isfinite(value)):
            return False
    return True


def saved_list(out: Path, job: str, name: str, tool: str, set_name: str, key: str) -> list[dict] | None:
    """The list under `key` of a learner's `<learner>/<tool>/<set>/summary.json`, if there is one
    (`rlmlab probe|frames <out>/<job>/<learner> --data <the set's parquet>` writes it), each
    entry checked for the fields the reports read (`SAVED_FIELDS`: types, finite numbers)."""
    path = run_path(out, job, name) / tool / set_name / "summary.json"
    if not path.exists():
        return None
    what = f"{path}: not an `rlmlab {tool}` summary"
    try:
        items = read_json(path, DataError, "summary.json")[key]
    except (DataError, KeyError, TypeError):
        raise DataError(what) from None
    if not (isinstance(items, list) and all(isinstance(g, dict) for g in items)):
        raise DataError(f"{what} (its '{key}' should be a list of objects)")
    fields = SAVED_FIELDS[tool]
    if not all(_fields_ok(g, fields) for g in items):
        raise DataError(f"{what} (each of its '{key}' needs {', '.join(f.rstrip('?') for f in fields)}, "
                        f"of the types `rlmlab {tool}` writes)")
    return items


def probe_groups(out: Path, job: str, name: str, set_name: str) -> list[dict] | None:
    """The groups of `rlmlab probe`'s summary for a learner's evaluation set, if it was probed."""
    return saved_list(out, job, name, "probe", set_name, "groups")


def pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}"


def near_one_decimals(x: float) -> int:
    """Decimals that give a percentage's shortfall from 100% two significant digits (one to
    three): 93.2, 99.77, 99.976. A per-token accuracy near 100% printed to one decimal hides
    differences that the paper reads (CoT slightly higher per token at large N)."""
    shortfall = 100 * (1 - x)
    if not 0 < shortfall < 10:  # NaN too: printed as `nan`, as `pct` prints it
        return 1
    return min(3, max(1, 1 - math.floor(math.log10(shortfall))))


def pct_near_one(x: float | None, decimals: int | None = None) -> str:
    """`pct` with `near_one_decimals(x)` decimals, or `decimals` given (an interval's bounds take
    the decimals of its point)."""
    if x is None:
        return "–"
    return f"{100 * x:.{near_one_decimals(x) if decimals is None else decimals}f}"


def count_ci(a: dict | None) -> str:
    """An `accuracy()` record as "k/n = p [lo, hi]" (percent, 95% Wilson interval)."""
    if a is None:
        return "–"
    return f"{a['correct']}/{a['n']} = {pct(a['accuracy'])} [{pct(a['ci95'][0])}, {pct(a['ci95'][1])}]"


def gap(a: float | None, b: float | None) -> str:
    return "–" if a is None or b is None else f"{100 * (a - b):+.1f}"
