"""`rlmlab probe RUN_DIR --data exprs`: the invariance probe of a trained model (rlmlab.measuring.probe).

Writes `results.parquet` (one row per expression: prediction points, non-invariant points,
witnesses, subproblems, non-invariant answers, the data file's columns) and `summary.json`
(the rates overall and per group, 95% Wilson intervals); prints a short table.
"""

from __future__ import annotations

from pathlib import Path

from rlmlab.cli.options import add_decoding_options
from rlmlab.cli.progress import stages
from rlmlab.errors import ConfigError
from rlmlab.learning.config import MAX_THREADS
from rlmlab.measuring.result_files import write_results
from rlmlab.safeio import refuse_symlinks
from rlmlab.task.taskfile import load_task

GROUP_COLUMNS = ("split", "bin", "construction")  # grouped by default when the data has them


def register(sub) -> None:
    p = sub.add_parser("probe", help="measure a model's non-invariance under the active-frame map",
                       description="At every prediction point of every canonical trace, the model's greedy "
                       "token on the complete prefix against the one on its active frame alone; and for every "
                       "subproblem of its own greedy trace, the value returned in context against the value "
                       "returned when the subproblem is posed alone (docs/observation.md).")
    p.add_argument("run_dir", metavar="RUN_DIR", nargs="?", default=None, help="training run folder")
    p.add_argument("--oracle", metavar="LEARNER", default=None, help="probe the exact predictor of LEARNER (g* "
                   "read through what it observes, e.g. cot) instead of a trained model: a calibration run that "
                   "must report zero; needs --out")
    p.add_argument("--data", required=True, help="pool parquet (an `expr` column; its other columns can "
                   "group the rates) or a text file, one expression per line")
    p.add_argument("--limit", type=int, default=None, help="first N expressions only")
    p.add_argument("--per-group", type=int, default=None, metavar="N",
                   help="first N expressions of each group of the first --by column (e.g. N per bin)")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/probe/<data name>)")
    p.add_argument("--which", default="best", help="checkpoint to load: best or last (default best)")
    p.add_argument("--by", action="append", default=None, metavar="COLUMN", help="group the rates by a "
                   f"column of the data (repeatable; default: those of {', '.join(GROUP_COLUMNS)} it has)")
    p.add_argument("--batch-size", type=int, default=64, help="expressions decoded at once (default 64)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="generated tokens limit per decoding")
    p.add_argument("--positions-only", action="store_true", help="skip the answer level (no decoding)")
    add_decoding_options(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    from rlmlab.decoding.driver import Limits
    from rlmlab.decoding.engine import ModelPredictor
    from rlmlab.decoding.oracle import oracle_predictor
    from rlmlab.learning.checkpoint import load_run
    from rlmlab.measuring.probe import probe, summarize_probe
    from rlmlab.measuring.score import read_grouped

    for name in ("limit", "per_group", "batch_size", "max_new_tokens", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {v}")
    if args.threads is not None and args.threads > MAX_THREADS:
        raise ConfigError(f"--threads must be at most {MAX_THREADS}, got {args.threads}")
    if args.run_dir is None and args.oracle is None:
        raise ConfigError("nothing to probe: give RUN_DIR (a trained model) or --oracle LEARNER")
    if args.run_dir is not None and args.oracle is not None:
        raise ConfigError("give RUN_DIR or --oracle LEARNER, not both")
    if args.oracle is not None:
        from rlmlab.learning.observe import observer

        observer(args.oracle)  # one-line error for an unknown learner, before any data is read
        if args.out is None:
            raise ConfigError("--oracle needs --out (there is no run folder to write into)")
    out = Path(args.out or Path(args.run_dir) / "probe" / Path(args.data).stem)
    refuse_symlinks(out, "--out", ConfigError)  # before the model is loaded and the data decoded
    task = load_task(args.task) if args.oracle is not None or args.task else None
    run_ = None
    if args.oracle is None:  # the run's own task (or the one asked for, which must be the run's)
        run_ = load_run(args.run_dir, which=args.which, task=task)
        task = run_.task
    exprs, extra, by = read_grouped(args.data, args.limit, args.by, GROUP_COLUMNS, args.per_group, task=task)
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    if args.oracle is not None:
        vocab, learner, step, source, which = task.vocab, args.oracle, None, f"oracle:{args.oracle}", "exact"
        predictor = oracle_predictor(learner, vocab, task.library)
    else:
        vocab, learner, step, source, which = run_.vocab, run_.learner, run_.step, str(args.run_dir), args.which
        predictor = ModelPredictor(run_.model)
    limits = Limits(max_new_tokens=args.max_new_tokens) if args.max_new_tokens else Limits()
    with stages(args.quiet) as stage:
        rows = probe(predictor, learner, exprs, vocab, extra, limits, args.batch_size, answers=not args.positions_only,
                     stage=stage, library=task.library)
    groups = summarize_probe(rows, by)
    summary = {"run_dir": source, "which": which, "step": step, "learner": learner if run_ is None else run_.named,
               "data": str(args.data), "groups": groups}
    written = write_results(out, rows, summary, indent=1)
    print(render(summary))
    print(f"wrote {written[0]} and {written[1]}")
    return 0


def _pct(rate, ci) -> str:
    if rate is None:
        return f"{'-':>7}  {'':>15}"
    return f"{100 * rate:6.2f}%  [{100 * ci[0]:5.2f}, {100 * ci[1]:5.2f}]"


def render(s: dict) -> str:
    model = f"{s['which']}, learner {s['learner']}" if s["step"] is None else \
        f"{s['which']}, step {s['step']}, learner {s['learner']}"
    lines = [f"invariance probe of {s['run_dir']} ({model}) on {s['data']}",
             f"  {'group':>22}  {'exprs':>5}  {'position non-inv.':>26}  {'answer non-inv.':>26}  subproblems"]
    for g in s["groups"]:
        name = "all" if g["group_by"] is None else f"{g['group_by']}={g['group']}"
        pos = _pct(g.get("position_rate"), g.get("position_ci95"))
        ans = _pct(g.get("answer_rate"), g.get("answer_ci95")) if "answer_rate" in g else f"{'-':>26}"
        lines.append(f"  {name:>22}  {g['n_expressions']:>5}  {pos:>26}  {ans:>26}  {g.get('subproblems', '-')}")
    return "\n".join(lines)
