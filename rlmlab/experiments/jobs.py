"""The paper's three experiments, end to end: data, training of both learners, evaluation.

An experiment is a list of independent *jobs*; a job trains one learner (a view) on one data
set and evaluates it on that experiment's evaluation sets. Every job writes into its own
folder and skips what is already there (a finished run has `done.json`; an evaluation
`results.jsonl` + `summary.json`), so re-running an experiment resumes it. Jobs run one
after another here, or on a Ray cluster with `ray_address`.

Layout of an experiment folder:

    experiment.json               kind, preset, parameters (what `rlmlab report` reads)
    data/                         the split or the shortcut data sets (parquet + JSON)
    <job>/<view>/                 a training run (rlmlab train's run folder)
    <job>/<view>/eval/<set>/      results.jsonl + summary.json of one evaluation set

Tables and figures are pure functions of these files (`rlmlab.experiments.report`).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rlmlab.errors import ConfigError, DataError
from rlmlab.experiments.splits import IID_SIZES, PER_BIN_CAP, REPRESENTATIVE

KINDS = ("length", "depth", "iid", "shortcuts")
REPORT_KINDS = (*KINDS, "recipe")  # a recipe comparison is a folder of `rlmlab train` runs, reported alike
LEARNERS = ("rm", "cot")


@dataclass(frozen=True)
class ExperimentPreset:
    """What one named preset runs: model, data sizes, training budget and evaluation sizes."""

    name: str
    """Preset name (smoke, small, paper)."""
    model: str
    """Model preset of `rlmlab.learning.config.PRESETS`."""
    pool_n: int = 500_000
    """Expressions in the pool the splits are drawn from (paper: 500,000)."""
    pool_seed: int = 42
    """Seed of that pool (paper: 42)."""
    length: int = REPRESENTATIVE["length"]
    """Length threshold L of the length experiment (paper's representative: 595)."""
    depth: int = REPRESENTATIVE["depth"]
    """Depth threshold K of the depth experiment (paper's representative: 10)."""
    per_bin_cap: int = PER_BIN_CAP
    """Evaluation expressions per bin (paper: 3,100 over 10 bins)."""
    n_val: int = 1_000
    """Validation expressions (teacher-forced loss, plateau, checkpoint selection)."""
    n_train: int | None = None
    """Cap on training expressions of threshold splits (None: every one below the threshold)."""
    answer_eval: int = 300
    """Validation expressions decoded greedily at each validation (final-answer accuracy selects
    the best checkpoint)."""
    minutes: float | None = None
    """Wall-clock training budget per learner."""
    max_steps: int | None = None
    """Step budget per learner."""
    patience: int | None = 10
    """Stop after this many validations without improvement (the paper trains to a plateau)."""
    eval_every: int = 500
    """Steps between validations."""
    train: dict = field(default_factory=dict)
    """Extra `train.*` settings for both learners, e.g. {"warmup_steps": 200}."""
    per_view: dict = field(default_factory=dict)
    """Settings per learner: {"cot": {"train.batch_size": 32}, ...} (dotted keys)."""
    iid_sizes: tuple[int, ...] = IID_SIZES
    """Nested training-set sizes of the IID sweep."""
    iid_seeds: int = 3
    """Seeds per size for the smaller sizes; sizes >= iid_one_seed_from get one."""
    iid_one_seed_from: int = 100_000
    """From this size on the IID sweep runs one seed (as the paper does for its largest sizes)."""
    iid_n_test: int = 5_000
    """IID test expressions (paper: 5,000)."""
    iid_minutes: float | None = None
    """Training budget per IID run (default: `minutes`). The sweep trains two learners per size
    and seed, so a CPU preset gives each run less time than a threshold-split learner."""
    iid_patience: int | None = None
    """Validations without improvement that stop an IID run (default: `patience`). At small N a
    run memorizes its training set early and its validation accuracy then stays flat, so a
    shorter patience hands the rest of its budget to the next size."""
    iid_max_trace: int | None = None
    """Draw the IID split from the pool's expressions whose complete trace has at most this many
    tokens (paper: None, the whole generator: ~540 tokens on average, up to ~6,900)."""
    iid_distinct_train: bool = True
    """IID training subsets hold distinct expressions, as the paper says ("N distinct
    expressions"); False keeps the pool's repeated draws (never a held-out text). Neither
    reaches the paper's N = 450,000 from the seed-42 pool of 500,000 (412,474 distinct
    training expressions, 447,413 rows with repeats): larger sizes are skipped and recorded."""
    shortcut_n_train: int = 10_000
    """Training expressions per shortcut construction."""
    shortcut_n_eval: int = 300
    """IID and OOD evaluation expressions per construction (paper: 300 each)."""
    shortcut_per_view: dict = field(default_factory=dict)
    """Settings per learner for the shortcut runs only, over `per_view` (their traces are several
    times longer than those of the threshold splits, so a batch of traces holds more tokens)."""
    shortcut_max_trace: int = 2048
    """Longest complete trace of the shortcut data sets (`ShortcutConfig.max_trace_len`; the
    paper fixes none, its CoT context is 4,096)."""
    eval_batch: int = 64
    """Expressions decoded at once."""

    def __post_init__(self):
        from rlmlab.learning.config import PRESETS as MODEL_PRESETS
        from rlmlab.learning.config import RunConfig, apply_settings

        where = f"experiment preset {self.name!r}"
        if self.model not in MODEL_PRESETS:
            raise ConfigError(f"{where}: unknown model preset {self.model!r} (have: {', '.join(MODEL_PRESETS)})")
        for name in ("pool_n", "per_bin_cap", "n_val", "answer_eval", "eval_every", "iid_seeds",
                     "iid_n_test", "shortcut_n_train", "shortcut_n_eval", "shortcut_max_trace", "eval_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{where}: {name} must be a positive integer, got {value!r}")
        for name in ("n_train", "max_steps", "patience", "iid_patience", "iid_max_trace"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{where}: {name} must be a positive integer or None, got {value!r}")
        for name in ("minutes", "iid_minutes"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{where}: {name} must be positive, got {value!r}")
        if not self.iid_sizes or any(n < 1 for n in self.iid_sizes) or list(self.iid_sizes) != sorted(self.iid_sizes):
            raise ConfigError(f"{where}: iid_sizes must be increasing positive sizes, got {self.iid_sizes!r}")
        # The training settings must be ones `rlmlab train` accepts (unknown keys, wrong types).
        apply_settings(RunConfig(), {f"train.{k}": v for k, v in self.train.items()})
        for view, settings in [*self.per_view.items(), *self.shortcut_per_view.items()]:
            apply_settings(RunConfig(), settings)

    def with_overrides(self, **kw) -> "ExperimentPreset":
        return replace(self, **{k: v for k, v in kw.items() if v is not None})

    def with_budget(self, minutes: float | None = None, max_steps: int | None = None) -> "ExperimentPreset":
        """The preset with every learner's budget set to `minutes` / `max_steps` where given (as
        `rlmlab run --minutes/--max-steps` asks), over the budgets it gives single learners."""
        drop = {key for key, value in (("train.max_minutes", minutes), ("train.max_steps", max_steps))
                if value is not None}

        def without(table: dict) -> dict:
            return {view: {k: v for k, v in settings.items() if k not in drop} for view, settings in table.items()}

        return replace(self.with_overrides(minutes=minutes, iid_minutes=minutes, max_steps=max_steps),
                       per_view=without(self.per_view), shortcut_per_view=without(self.shortcut_per_view))


PRESETS: dict[str, ExperimentPreset] = {
    # CI and tests: every stage of every experiment in seconds; the numbers mean nothing.
    "smoke": ExperimentPreset(
        name="smoke", model="tiny", pool_n=4_000, length=96, depth=5, per_bin_cap=4, n_val=20, answer_eval=5,
        max_steps=3, patience=None, eval_every=2, train={"warmup_steps": 1, "batch_size": 4},
        iid_sizes=(100, 200), iid_seeds=1, iid_n_test=20, shortcut_n_train=40, shortcut_n_eval=6, eval_batch=8),
    # The task on a 2-core CPU at thresholds a third of the paper's (L = 197, K = 5), a 3-layer
    # width-128 model and a 2.5-hour budget per learner; its committed results are under
    # results/*-small. Sizing: docs/cpu-sizing.md.
    "small": ExperimentPreset(
        name="small", model="small", length=197, depth=5, minutes=150.0, patience=12, eval_every=300,
        answer_eval=300, train={"warmup_steps": 300},
        per_view={"rm": {"train.batch_size": 256}, "cot": {"train.batch_size": 128}},
        # Shortcut traces are several times longer than the split's: 32 of them already make a
        # step of ~15k positions (the paper's CoT batch is 32 too).
        shortcut_per_view={"cot": {"train.batch_size": 32}},
        # The IID sweep draws from the length split's training distribution (traces of at most
        # L tokens) rather than the whole generator's, so that an hour per run measures samples
        # rather than budget; a run that memorizes its set stops after five flat validations.
        iid_sizes=(300, 1_000, 3_000, 10_000, 30_000), iid_seeds=1, iid_n_test=1_000, iid_max_trace=197,
        iid_minutes=60.0, iid_patience=5, shortcut_n_train=10_000,
        # Shortcut traces of up to 600 tokens instead of 2,048: a third of the training cost per example.
        shortcut_max_trace=600),
    # The paper's splits on this CPU: its thresholds L = 595 and K = 10, its bins and 310
    # evaluation expressions per bin, with the CPU-sized model and the training recipe chosen by
    # the equal-time comparison in docs/recipe.md (results/recipe-595).
    "paper-cpu": ExperimentPreset(
        name="paper-cpu", model="cpu", length=595, depth=10, patience=12, answer_eval=300,
        per_view={"rm": {"train.batch_size": 256, "train.lr": 1e-3, "train.warmup_steps": 300,
                         "train.eval_every": 300, "train.max_minutes": 90.0},
                  "cot": {"train.batch_size": 16, "train.lr": 3e-3, "train.warmup_steps": 100,
                          "train.eval_every": 1000, "train.max_minutes": 240.0}}),
    # The paper's recipe for a GPU: 6L/6H/384, L = 595, K = 10, all sample sizes; CoT with
    # batch 32 (4,096-token context), RM batch 64; trained to a plateau.
    "paper": ExperimentPreset(
        name="paper", model="paper", length=595, depth=10, patience=20, eval_every=1000, answer_eval=1000,
        train={"warmup_steps": 2000}, per_view={"cot": {"train.batch_size": 32}}),
}


def get_preset(name: str) -> ExperimentPreset:
    if name not in PRESETS:
        raise ConfigError(f"unknown experiment preset {name!r} (have: {', '.join(PRESETS)})")
    return PRESETS[name]


# --- jobs -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Job:
    """Train one learner on one data set, then evaluate it on named evaluation sets."""

    name: str
    """Folder of the job inside the experiment folder (e.g. "length-197", "iid-N1000-s0")."""
    view: str
    """The learner: "rm" or "cot"."""
    train: str
    """Training expressions (parquet)."""
    val: str
    """Validation expressions (parquet)."""
    evals: dict
    """{set name: parquet path}; extra columns of the file (bin, signal, ...) go into each result."""
    settings: dict
    """Typed run settings by dotted key (`train.lr`: 3e-3, `model.preset`: "cpu", ...), the keys of
    `rlmlab train --section.key=value`."""
    eval_batch: int = 64
    """Expressions decoded at once."""

    def run_dir(self, out: Path) -> Path:
        return out / self.name / self.view


# Columns of an evaluation file that each result carries (bins, OOD flags, signals, pool ids).
RESULT_COLUMNS = ("id", "bin", "bin_index", "ood", "ratio", "within_tmax", "signal")

# What a finished run's outputs are, besides its checkpoints: all describe its best checkpoint.
RUN_OUTPUTS = ("done.json", "eval", "probe", "frames")


def reopen_to_extend(run_dir: Path, settings: dict) -> str | None:
    """Reopen a finished run whose time or step budget ran out when `settings` now ask for a
    larger one: its outputs (done.json, evaluations, probes, frame tables) move to
    `superseded-step<N>/` in the run folder, so that the run resumes from `last` and is evaluated
    afresh. Returns why it stays finished, or None when it was reopened.

    The learning rate follows the cosine to the horizon of the new budget, so an extended run
    restarts warm from where the old schedule ended; it is not the run a larger budget would
    have made from the start."""
    try:
        done = json.loads((run_dir / "done.json").read_text())
        saved = json.loads((run_dir / "config.json").read_text())["train"]
        reason = done.get("stop_reason")
    except (ValueError, KeyError, TypeError, AttributeError):  # UnicodeDecodeError is a ValueError
        raise DataError(f"{run_dir}: done.json or config.json is not what `rlmlab run` writes") from None
    if reason not in ("max_minutes", "max_steps"):
        return f"it stopped on {reason}, not on its budget"
    key = reason
    asked = settings.get(f"train.{key}")
    if asked is None or saved.get(key) is None or asked <= saved[key]:
        return f"it ran out of {key}={saved.get(key)} and the budget asked for now is {key}={asked}"
    keep = run_dir / f"superseded-step{done.get('step')}"
    if keep.exists():
        raise DataError(f"{keep} exists already: move it away to extend {run_dir} again from that step")
    keep.mkdir()
    for name in RUN_OUTPUTS:
        if (run_dir / name).exists():
            (run_dir / name).rename(keep / name)
    return None


def run_job(job: Job, out: str | Path, progress: bool = True, extend: bool = False) -> dict:
    """Train (or resume, or skip when done) and evaluate; returns {set: summary}. With `extend`, a
    run that finished on its budget continues when the job now asks for a larger one
    (`reopen_to_extend`)."""
    from rlmlab.decoding.infer import ModelPredictor
    from rlmlab.learning.checkpoint import load_run
    from rlmlab.learning.config import RunConfig, apply_settings
    from rlmlab.learning.train import prepare_data, resolve_device, train
    from rlmlab.measuring.score import answer_accuracy_fn, evaluate_file

    out = Path(out)
    run_dir = job.run_dir(out)
    done = run_dir / "done.json"
    if done.exists() and not _finished(done):
        print(f"{done}: not a finished-run marker; the run is resumed and evaluated again", file=sys.stderr)
        done.unlink()
    if extend and done.exists():
        stays = reopen_to_extend(run_dir, job.settings)
        print(f"{run_dir}: " + (f"not extended: {stays}" if stays else "extended; earlier outputs moved to "
                                "superseded-step*/"), file=sys.stderr)
    if not done.exists():
        cfg = apply_settings(RunConfig(), {**job.settings, "data.view": job.view, "data.train": job.train,
                                            "data.val": job.val})
        cfg.require_stop_rule()
        split = prepare_data(cfg.data)
        validate_fn = None
        if cfg.train.answer_eval:
            n = min(cfg.train.answer_eval, len(split.val_exprs))
            validate_fn = answer_accuracy_fn(split.val_exprs[:n])
        resume = (run_dir / "last" / "checkpoint.json").exists()
        result = train(cfg, split.train, split.val, run_dir, resume=resume, validate_fn=validate_fn,
                       progress=progress)
        if result.stop_reason == "interrupted":
            # Ctrl-C saved `last`; the run is unfinished, so neither mark it done (a re-run would
            # skip it) nor evaluate a half-trained model. The re-run resumes from `last`.
            raise KeyboardInterrupt
        done.write_text(json.dumps({"step": result.step, "stop_reason": result.stop_reason,
                                    "select_metric": result.select_metric, "best_score": result.best_score,
                                    "best_step": result.best_step}, indent=2) + "\n")
    summaries = {}
    loaded = None
    for set_name, path in job.evals.items():
        eval_dir = run_dir / "eval" / set_name
        saved = _evaluated(eval_dir)
        if saved is not None:
            summaries[set_name] = saved
            continue
        # Decode where the model trained: a CUDA run evaluates on the GPU too.
        loaded = loaded or load_run(run_dir, "best", resolve_device(job.settings.get("train.device", "auto")))
        # Inexact traces are kept so that `rlmlab view` can show what the model wrote where it erred.
        _, summaries[set_name] = evaluate_file(
            eval_dir, ModelPredictor(loaded.model), loaded.view, path, loaded.vocab, model=loaded.model,
            batch_size=job.eval_batch, columns=RESULT_COLUMNS, traces="inexact",
            header={"predictor": "model", "run_dir": str(run_dir), "which": "best", "step": loaded.step,
                    "set": set_name})
    return summaries


def _finished(done: Path) -> bool:
    """Whether `done.json` is the marker run_job writes (a finished run is skipped on its word)."""
    try:
        d = json.loads(done.read_text())
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    return (isinstance(d, dict) and isinstance(d.get("stop_reason"), str) and isinstance(d.get("step"), int)
            and not isinstance(d.get("step"), bool))


def _evaluated(eval_dir: Path) -> dict | None:
    """The summary of a complete evaluation in `eval_dir`, or None when there is none or when its
    files are damaged (results.jsonl unreadable or not as long as the summary says): then the
    set is evaluated again."""
    from rlmlab.measuring.results import read_results

    if not ((eval_dir / "summary.json").exists() and (eval_dir / "results.jsonl").exists()):
        return None
    try:
        summary = json.loads((eval_dir / "summary.json").read_text())
        complete = isinstance(summary, dict) and summary.get("n") == len(read_results(eval_dir / "results.jsonl"))
    except (ValueError, RecursionError, DataError):
        complete = False
    if not complete:
        print(f"{eval_dir}: damaged evaluation files; evaluating again", file=sys.stderr)
        return None
    return summary


def run_jobs(jobs: list[Job], out: Path, ray_address: str | None = None, progress: bool = True,
             extend: bool = False) -> list[dict]:
    """Run jobs locally in order, or spread them over a Ray cluster."""
    if ray_address is None:
        return [run_job(j, out, progress, extend) for j in jobs]
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray-address needs Ray: pip install 'ray[default]'") from None
    ray.init(address=ray_address)
    remote = ray.remote(num_cpus=1)(run_job)
    return ray.get([remote.remote(j, str(out), False, extend) for j in jobs])


# --- experiments ----------------------------------------------------------------------------

def _settings(p: ExperimentPreset, view: str, seed: int = 1337, per_view: dict | None = None) -> dict:
    s = {"model.preset": p.model, "train.seed": seed, "train.eval_every": p.eval_every,
         "train.answer_eval": p.answer_eval}
    if p.minutes is not None:
        s["train.max_minutes"] = p.minutes
    if p.max_steps is not None:
        s["train.max_steps"] = p.max_steps
    if p.patience is not None:
        s["train.patience"] = p.patience
    s.update({f"train.{k}": v for k, v in p.train.items()})
    # A view without settings of its own (rm-frames, a new observation function) takes those of
    # the learner whose driver it decodes with.
    from rlmlab.learning.observe import observer

    for table in (p.per_view, per_view or {}):
        s.update(table.get(view, table.get(observer(view).name, {})))
    return s


def _pool(p: ExperimentPreset, out: Path, progress: bool = True):
    from rlmlab.task.pool import build_pool, read_pool, write_pool

    path = out / "data" / f"pool-{p.pool_n}-s{p.pool_seed}.parquet"
    if not path.exists():
        write_pool(build_pool(p.pool_n, p.pool_seed, progress=progress), path)
    return read_pool(path)


def _write_meta(out: Path, kind: str, p: ExperimentPreset, extra: dict) -> None:
    """Write experiment.json; a folder that holds another experiment (kind, threshold) is refused
    rather than relabelled, which would hide its runs from the report."""
    out.mkdir(parents=True, exist_ok=True)
    meta = {"kind": kind, "preset": asdict(p), **extra}
    _refuse_another_experiment(out, kind, meta.get("threshold"))
    (out / "experiment.json").write_text(json.dumps(meta, indent=2) + "\n")


def _refuse_another_experiment(out: Path, kind: str, threshold: int | None) -> None:
    if not (out / "experiment.json").exists():
        return
    old = read_meta(out)
    for key, value in (("kind", kind), ("threshold", threshold)):
        if old.get(key) != value:
            raise ConfigError(f"{out} holds another experiment ({key} {old.get(key)!r}, not {value!r}); "
                              "give this one its own --out")


def read_meta(out: Path) -> dict:
    """An experiment folder's `experiment.json`."""
    path = out / "experiment.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{out}: no experiment.json (not an experiment folder from `rlmlab run`)") from None
    except (ValueError, UnicodeDecodeError):
        raise DataError(f"{path}: not valid JSON") from None
    if not isinstance(meta, dict) or meta.get("kind") not in REPORT_KINDS:
        raise DataError(f"{path}: not an experiment description (its 'kind' should be one of "
                        f"{', '.join(REPORT_KINDS)})")
    needs = {"length": {"threshold": int, "split": dict}, "depth": {"threshold": int, "split": dict},
             "iid": {"sizes": list}, "shortcuts": {"constructions": list}, "recipe": {"runs": list}}[meta["kind"]]
    for key, kind in needs.items():
        if not isinstance(meta.get(key), kind):
            raise DataError(f"{path}: a {meta['kind']} experiment needs '{key}' ({kind.__name__})")
    return meta


def _check_saved(data: Path, saved: dict, asked: dict) -> None:
    """A re-run reuses the data it finds in `data`; refuse it when the preset now asks for
    other data, rather than report numbers of the old data under the new settings."""
    differ = [f"{k}={saved.get(k)!r} (asked: {v!r})" for k, v in asked.items() if saved.get(k) != v]
    if differ:
        raise ConfigError(f"{data} was built with {', '.join(differ)}; use another --out, or delete it to rebuild")


def _check_split(data: Path, params: dict, p: ExperimentPreset, asked: dict) -> None:
    """`_check_saved` for a split: its own parameters and the pool it was drawn from."""
    pool = params.get("pool") or {}
    _check_saved(data, {**params, "pool n": pool.get("n"), "pool seed": pool.get("seed")},
                 {**asked, "pool n": p.pool_n, "pool seed": p.pool_seed})


def plan_threshold(kind: str, p: ExperimentPreset, out: Path, threshold: int | None = None,
                   views=LEARNERS, progress: bool = True) -> list[Job]:
    from rlmlab.experiments.splits import Split, threshold_split

    threshold = threshold if threshold is not None else (p.length if kind == "length" else p.depth)
    data = out / "data" / f"{kind}-{threshold}"
    if not (data / "split.json").exists():
        split = threshold_split(_pool(p, out, progress), kind, threshold, n_val=p.n_val, per_bin_cap=p.per_bin_cap,
                                n_train=p.n_train)
        split.save(data)
    split = Split.load(data)
    _check_split(data, split.params, p, {"n_val": p.n_val, "per_bin_cap": p.per_bin_cap,
                                         "n_train_requested": p.n_train})
    _write_meta(out, kind, p, {"threshold": threshold, "split": split.params})
    return [Job(f"{kind}-{threshold}", v, str(data / "train.parquet"), str(data / "val.parquet"),
                {"eval": str(data / "eval.parquet")}, _settings(p, v), p.eval_batch) for v in views]


def plan_iid(p: ExperimentPreset, out: Path, views=LEARNERS, sizes=None, progress: bool = True) -> list[Job]:
    """Jobs of the IID sweep over `sizes` (default: the preset's). Runs on different sizes or
    learners may share the folder: the experiment lists every size any of them planned."""
    import pyarrow.parquet as pq

    from rlmlab.experiments.splits import Split, iid_split

    data = out / "data" / "iid"
    if not (data / "split.json").exists():
        iid_split(_pool(p, out, progress), n_test=p.iid_n_test, n_val=p.n_val, dedupe_train=p.iid_distinct_train,
                  max_trace_len=p.iid_max_trace).save(data)
    split = Split.load(data)
    _check_split(data, split.params, p, {"max_trace_len": p.iid_max_trace, "n_test": p.iid_n_test,
                                         "n_val": p.n_val, "dedupe_train": p.iid_distinct_train})
    available = split.train.num_rows
    wanted = sorted(set(sizes or p.iid_sizes))
    if any(not isinstance(n, int) or n < 1 for n in wanted):
        raise ConfigError(f"IID sizes must be positive integers, got {sizes!r}")
    sizes = [n for n in wanted if n <= available]
    skipped = [n for n in wanted if n > available]
    planned = set(sizes)
    if (out / "experiment.json").exists():
        planned |= set(read_meta(out).get("sizes", ()))
    meta = {"split": split.params, "sizes": sorted(planned)}
    if skipped:
        # The paper's N = 450,000 does not fit its own 500,000-expression pool (see
        # iid_distinct_train). Recorded in experiment.json and the report, not silently dropped.
        meta["skipped_sizes"] = {"sizes": skipped, "reason": f"the split has {available} training expressions"}
        print(f"rlmlab: IID sizes {', '.join(map(str, skipped))} skipped: the split has {available} training "
              "expressions", file=sys.stderr)
    _write_meta(out, "iid", p, meta)
    jobs = []
    for n in sizes:
        path = data / f"train-{n}.parquet"
        if not path.exists():
            pq.write_table(split.train_subset(n), path)
        seeds = 1 if n >= p.iid_one_seed_from else p.iid_seeds
        for seed in range(seeds):
            for v in views:
                jobs.append(Job(f"iid-N{n}-s{seed}", v, str(path), str(data / "val.parquet"),
                                {"test": str(data / "test.parquet")}, _iid_settings(p, v, seed), p.eval_batch))
    return jobs


def _iid_settings(p: ExperimentPreset, view: str, seed: int) -> dict:
    # The paper's IID sweep uses no weight decay.
    s = {**_settings(p, view, seed=1337 + seed), "train.weight_decay": 0.0}
    if p.iid_minutes is not None:
        s["train.max_minutes"] = p.iid_minutes
    if p.iid_patience is not None:
        s["train.patience"] = p.iid_patience
    return s


def plan_shortcuts(p: ExperimentPreset, out: Path, names=None, views=LEARNERS) -> list[Job]:
    """Jobs of the constructions `names` (default: all six). Runs on subsets share the folder:
    the experiment lists every construction any of them planned, in the table's order."""
    import pyarrow.parquet as pq

    from rlmlab.experiments.shortcuts import (
        CONSTRUCTIONS,
        ShortcutConfig,
        ShortcutDataset,
        build_shortcut_dataset,
    )

    names = list(names or CONSTRUCTIONS)
    unknown = [n for n in names if n not in CONSTRUCTIONS]
    if unknown:
        raise ConfigError(f"unknown shortcut construction {unknown[0]!r} (have: {', '.join(CONSTRUCTIONS)})")
    planned = set(names)
    if (out / "experiment.json").exists():
        planned |= set(read_meta(out).get("constructions", ()))
    _write_meta(out, "shortcuts", p, {"constructions": [n for n in CONSTRUCTIONS if n in planned]})
    config = ShortcutConfig(max_trace_len=p.shortcut_max_trace)
    jobs = []
    for name in names:
        data = out / "data" / f"shortcut-{name}"
        if not (data / "shortcut.json").exists():
            build_shortcut_dataset(name, n_train=p.shortcut_n_train, n_val=min(p.n_val, 300),
                                   n_iid=p.shortcut_n_eval, n_ood=p.shortcut_n_eval, config=config).save(data)
        ds = ShortcutDataset.load(data)
        saved = {**ds.params, "max_trace_len": (ds.params.get("config") or {}).get("max_trace_len")}
        _check_saved(data, saved, {"n_train": p.shortcut_n_train, "n_val": min(p.n_val, 300),
                                   "n_iid": p.shortcut_n_eval, "n_ood": p.shortcut_n_eval,
                                   "max_trace_len": p.shortcut_max_trace})
        for part in ("iid", "ood"):
            if not (data / f"{part}.parquet").exists():
                pq.write_table(getattr(ds, part), data / f"{part}.parquet")
        for v in views:
            jobs.append(Job(f"shortcut-{name}", v, str(data / "train.parquet"), str(data / "val.parquet"),
                            {"iid": str(data / "iid.parquet"), "ood": str(data / "ood.parquet")},
                            _settings(p, v, per_view=p.shortcut_per_view),
                            p.eval_batch))
    return jobs


def run_experiment(kind: str, preset: str | ExperimentPreset, out: str | Path, *, threshold: int | None = None,
                   views=LEARNERS, constructions=None, sizes=None, ray_address: str | None = None,
                   progress: bool = True, extend: bool = False) -> list[Job]:
    """Build the data, train both learners, evaluate; resumable. Returns the jobs it ran.
    `constructions` picks shortcut constructions (default all six), `sizes` IID training-set
    sizes (default the preset's); `extend` continues finished runs to a larger budget."""
    if kind not in KINDS:
        raise ConfigError(f"unknown experiment {kind!r} (have: {', '.join(KINDS)})")
    p = preset if isinstance(preset, ExperimentPreset) else get_preset(preset)
    out = Path(out)
    if kind in ("length", "depth") and threshold is None:
        threshold = p.length if kind == "length" else p.depth
    _refuse_another_experiment(out, kind, threshold)  # before any data is built
    t0 = time.perf_counter()
    if kind in ("length", "depth"):
        jobs = plan_threshold(kind, p, out, threshold, views, progress)
    elif kind == "iid":
        jobs = plan_iid(p, out, views, sizes, progress)
    else:
        jobs = plan_shortcuts(p, out, constructions, views=views)
    run_jobs(jobs, out, ray_address, progress, extend)
    print(f"{kind}: {len(jobs)} jobs done in {time.perf_counter() - t0:.0f}s; tables: rlmlab report {out}")
    return jobs
