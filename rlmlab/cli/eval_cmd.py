"""`rlmlab eval RUN_DIR --data exprs`: greedy decoding of an expression set, scored.

Writes `results.parquet` (one row per expression: truth, prediction, validity, reason, trace
statistics, per-token counts), `traces.parquet` (the produced trace where it is not exact) and
`summary.json`;
prints a short table. `--oracle rm|cot` runs the true rule instead of a model, to check
the drivers and the scoring on any expression set.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rlmlab.cli.options import add_decoding_options
from rlmlab.cli.progress import stages
from rlmlab.errors import ConfigError, DataError
from rlmlab.learning.config import MAX_THREADS
from rlmlab.learning.learner import get_learner
from rlmlab.measuring.result_files import RESULTS, eval_dir, summary_learner
from rlmlab.safeio import folder_kind, read_json, refuse_other_folder, shorten
from rlmlab.task.taskfile import load_task

MAX_DEPTH = 64  # the default of rlmlab.decoding.driver.Limits.max_depth (test_cli checks they agree)
RENAMED_FIELDS = {"n_frames": "n_frame_examples", "pred_n_frames": "pred_n_frame_examples"}  # old --by names


def register(sub) -> None:
    p = sub.add_parser("eval", help="decode an expression set greedily and score it",
                       description="Greedy decoding (RM: the stack driver; CoT: the flat decoder) of an "
                       "expression set, scored by final-answer accuracy (95% Wilson) and teacher-forced "
                       "per-token accuracy (bootstrap over expressions).")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="training run folder (not with --oracle)")
    p.add_argument("--data", required=True, help="pool parquet (an `expr` column) or a text file, one "
                   "expression per line")
    p.add_argument("--limit", type=int, default=None, help="first N expressions only")
    p.add_argument("--batch-size", type=int, default=None,
                   help="expressions decoded at once (default 256 on CUDA, 64 on CPU)")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/eval/<data name>, and RUN_DIR/eval "
                   "for data named eval; with --oracle runs/oracle-<learner>/eval/<data name>)")
    p.add_argument("--which", default="best", help="checkpoint to load: best or last (default best)")
    p.add_argument("--oracle", nargs="?", const=True, default=None, metavar="LEARNER",
                   help="run the oracle predictor g* of LEARNER instead of a model: rm (stack driver), "
                   "cot (g* composed with the active-frame map, through the CoT decoder), reduce or window:K "
                   "(g* o Pi_rec of what that observation shows)")
    # The old spelling `--oracle --view LEARNER`, still accepted.
    p.add_argument("--view", dest="oracle_learner", default=None, help=argparse.SUPPRESS)
    p.add_argument("--no-per-token", action="store_true", help="skip teacher-forced per-token accuracy")
    p.add_argument("--by", default=None, metavar="KEY", help="also print accuracy per value of a result "
                   "field, e.g. max_depth or root")
    p.add_argument("--max-depth", type=int, default=MAX_DEPTH, help="stack depth limit "
                   f"(default {MAX_DEPTH})")
    p.add_argument("--max-new-tokens", type=int, default=None, help="generated tokens limit (default: 8 times "
                   "what the expression's canonical trace generates, plus 64)")
    p.add_argument("--max-frame-tokens", type=int, default=None, help="active-frame width limit "
                   "(default: none beyond the model's block size)")
    p.add_argument("--traces", action="store_true", help="save every produced trace in traces.parquet (by "
                   "default only those that differ from the canonical trace)")
    add_decoding_options(p)
    p.set_defaults(handler=run)


def _check_args(args) -> None:
    if args.oracle is not None:
        if args.run_dir is not None:
            raise ConfigError("give RUN_DIR or --oracle, not both")
        named = args.oracle if isinstance(args.oracle, str) else None
        if named is not None and args.oracle_learner is not None and named != args.oracle_learner:
            raise ConfigError(f"--oracle {named} and --view {args.oracle_learner} name two learners")
        args.oracle = named or args.oracle_learner
        if args.oracle is None:
            raise ConfigError("--oracle needs a learner: --oracle rm or --oracle cot")
        get_learner(args.oracle)  # an unknown learner or a bad parameter is a one-line error
    else:
        if args.run_dir is None:
            raise ConfigError("give RUN_DIR (a training run folder), or --oracle rm|cot")
        if args.oracle_learner is not None:
            raise ConfigError("--view goes with --oracle; a run's learner is the one it was trained as")
    for name in ("limit", "batch_size", "max_depth", "max_new_tokens", "max_frame_tokens", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {v}")
    if args.threads is not None and args.threads > MAX_THREADS:
        raise ConfigError(f"--threads must be at most {MAX_THREADS}, got {args.threads}")


def run(args) -> int:
    # Imported here so that `rlmlab --help` and the commands that need no model skip torch.
    from rlmlab.decoding.driver import Limits
    from rlmlab.decoding.engine import ModelPredictor
    from rlmlab.decoding.oracle import oracle_predictor
    from rlmlab.learning.checkpoint import load_run
    from rlmlab.measuring.score import RESULT_FIELDS, evaluate_file, read_expressions
    from rlmlab.measuring.stats import group_accuracy

    _check_args(args)
    args.by = RENAMED_FIELDS.get(args.by, args.by)
    task = load_task(args.task) if args.oracle or args.task else None
    run_ = None
    if not args.oracle:  # the run's own task (or the one asked for, which must be the run's)
        run_ = load_run(args.run_dir, which=args.which, task=task)
        task = run_.task
    exprs, extra = read_expressions(args.data, args.limit, task=task)
    if args.by is not None and args.by not in RESULT_FIELDS + tuple(extra[0]):
        raise ConfigError(f"--by {args.by}: no such result field (have: {', '.join(RESULT_FIELDS + tuple(extra[0]))})")
    stem = Path(args.data).stem
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    model, header = None, {}
    if args.oracle:
        name, vocab = args.oracle, task.vocab
        predictor = oracle_predictor(name, vocab, task.library)
        out = Path(args.out or eval_dir(Path("runs") / f"oracle-{name}", stem))
        header = {"predictor": "oracle"}
    else:
        name, vocab, model = run_.named, run_.vocab, run_.model
        predictor = ModelPredictor(model)
        out = Path(args.out or eval_dir(args.run_dir, stem))
        header = {"predictor": "model", "run_dir": str(args.run_dir), "which": args.which, "step": run_.step}
    limits = Limits(args.max_depth, args.max_frame_tokens, args.max_new_tokens)
    _refuse_another_evaluation(out, {"learner": name, **header})

    with stages(args.quiet) as stage:
        results, summary = evaluate_file(out, predictor, name, args.data, vocab, limits=limits, limit=args.limit,
                                         batch_size=args.batch_size, model=None if args.no_per_token else model,
                                         traces=True if args.traces else "inexact",
                                         progress=stage and stage(f"eval {name}", len(exprs), "expr"), header=header,
                                         task=task)
    print(render(summary))
    if args.by:
        print(render_groups(group_accuracy(results, args.by), args.by))
    print(f"wrote {out / RESULTS} and {out / 'summary.json'}")
    return 0


def _refuse_another_evaluation(out: Path, header: dict) -> None:
    """An evaluation replaces one of the same predictor (a re-run), never another run's or the
    oracle's evaluation, nor a folder that holds something else."""
    refuse_other_folder(out, "evaluation", "--out", ConfigError)
    if folder_kind(out) != "evaluation":
        return
    saved = read_json(out / "summary.json", DataError, "summary.json")
    # Compared without encodings: summaries written before they named encodings call a "cot@rope" run "cot".
    same = isinstance(saved, dict) and saved.get("predictor") == header.get("predictor") and (
        (summary_learner(saved) or "").partition("@")[0] == header["learner"].partition("@")[0]) and (
        header["predictor"] == "oracle" or isinstance(saved.get("run_dir"), str)
        and Path(saved["run_dir"]).resolve() == Path(header["run_dir"]).resolve())
    if not same:
        who = (f"{saved.get('predictor')} {saved.get('run_dir') or ''}".strip() if isinstance(saved, dict) else "?")
        raise ConfigError(f"--out {out}: holds the evaluation of another predictor ({shorten(who)}); "
                          "choose another folder")


def render(s: dict) -> str:
    who = "oracle" if s["predictor"] == "oracle" else f"{s['run_dir']} ({s['which']}, step {s['step']})"
    lo, hi = s["ci95"]
    lines = [f"{s['n']} expressions from {s['data']}, learner {summary_learner(s)}, {who}",
             f"  final-answer accuracy  {100 * s['accuracy']:6.2f}%  95% CI [{100 * lo:.2f}, {100 * hi:.2f}]"
             f"  ({s['correct']}/{s['n']})",
             f"  valid traces           {100 * s['valid']:6.2f}%",
             f"  exact traces           {100 * s['trace_exact']:6.2f}%"]
    if "per_token" in s:
        plo, phi = s["per_token_ci95"]
        lines.append(f"  per-token (teacher-f.) {100 * s['per_token']:6.2f}%  95% CI [{100 * plo:.2f}, "
                     f"{100 * phi:.2f}]  ({s['per_token_positions']:,} positions)")
    lines.append(f"  decoding               {s['seconds']:.1f}s, {s['expr_per_s']:.1f} expr/s, "
                 f"{s['tokens_per_s']:,.0f} generated tok/s")
    for reason, n in list(s["invalid_reasons"].items())[:5]:
        lines.append(f"  invalid: {n} x {reason}")
    return "\n".join(lines)


def render_groups(groups: list[dict], key: str) -> str:
    lines = [f"  {key:>16}  {'n':>6}  {'accuracy':>8}  95% CI"]
    for g in groups:
        lo, hi = g["ci95"]
        lines.append(f"  {json.dumps(g['group']):>16}  {g['n']:>6}  {100 * g['accuracy']:7.2f}%  "
                     f"[{100 * lo:.1f}, {100 * hi:.1f}]")
    return "\n".join(lines)
