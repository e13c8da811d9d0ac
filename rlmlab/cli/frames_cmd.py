"""`rlmlab frames RUN_DIR --data exprs [--train train.parquet]`: where a model errs, frame by frame.

Scores the model teacher-forced on every active-frame example of every canonical trace
(rlmlab.measuring.frame_errors) and writes `frames.parquet` (one row per example: function, call, depth,
lengths, mispredicted targets, whether training showed the call, the data file's columns),
`summary.json` (wrong-example rates with 95% Wilson intervals per group, function and
seen/unseen) and `table.md`, which it also prints.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlmlab.cli.options import add_decoding_options
from rlmlab.cli.progress import stages
from rlmlab.errors import ConfigError
from rlmlab.learning.config import MAX_THREADS
from rlmlab.safeio import refuse_symlinks

GROUP_COLUMNS = ("ood", "split", "construction")  # the default grouping, when the data has one


def register(sub) -> None:
    p = sub.add_parser("frames", help="teacher-forced errors per active frame, seen vs unseen in training",
                       description="Teacher-forced errors of a trained model on every active-frame example of "
                       "the canonical traces, by function, per group of the data, and (with --train) by whether "
                       "the frame's call occurs among the frames of the training traces.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="training run folder")
    p.add_argument("--data", required=True, help="pool parquet (an `expr` column; its other columns can "
                   "group the rates) or a text file, one expression per line")
    p.add_argument("--train", default=None, help="the training expressions (parquet or text): marks each "
                   "frame seen or unseen in training")
    p.add_argument("--by", default=None, metavar="COLUMN", help="group by a column of the data (default: the "
                   f"first of {', '.join(GROUP_COLUMNS)} it has)")
    p.add_argument("--limit", type=int, default=None, help="first N expressions only")
    p.add_argument("--per-group", type=int, default=None, metavar="N",
                   help="first N expressions of each bin (or, without bins, of each --by group)")
    p.add_argument("--top", type=int, default=12, help="functions listed in the printed table (default 12)")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/frames/<data name>)")
    p.add_argument("--which", default="best", help="checkpoint to load: best or last (default best)")
    add_decoding_options(p)
    p.set_defaults(handler=run)


def run(args) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlmlab.learning.checkpoint import load_run
    from rlmlab.measuring.frame_errors import (
        frame_records,
        render_frames,
        summarize_frames,
        training_calls,
    )
    from rlmlab.measuring.score import read_expressions, read_grouped
    from rlmlab.task.trace import execute

    for name in ("limit", "per_group", "top", "threads"):
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {v}")
    if args.threads is not None and args.threads > MAX_THREADS:
        raise ConfigError(f"--threads must be at most {MAX_THREADS}, got {args.threads}")
    # --per-group takes the first N of each bin when the data has bins (a length or depth split is
    # stored bin by bin, so the first N of each OOD flag would all come from the nearest bins).
    out = Path(args.out or Path(args.run_dir) / "frames" / Path(args.data).stem)
    refuse_symlinks(out, "--out", ConfigError)  # before the model is loaded and the data read
    run_ = load_run(args.run_dir, which=args.which, task=args.task)
    library = run_.task.library
    exprs, extra, _ = read_grouped(args.data, args.limit, None, ("bin", *GROUP_COLUMNS), args.per_group,
                                   task=run_.task)
    by = args.by or next((c for c in GROUP_COLUMNS if c in extra[0]), None)
    if by is not None and by not in extra[0]:
        raise ConfigError(f"--by {by}: no such column in {args.data} (have: {', '.join(extra[0]) or 'none'})")
    seen = training_calls(read_expressions(args.train, task=run_.task)[0], library) if args.train else None
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    with stages(args.quiet) as stage:
        records = frame_records(run_.model, run_.vocab, run_.learner, [execute(e, library) for e in exprs], seen, extra,
                                progress=stage and stage("frames: teacher-forced examples", None, "row"))
    rows = summarize_frames(records, by)
    table = render_frames(rows, args.top)
    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), out / "frames.parquet")
    summary = {"run_dir": str(args.run_dir), "which": args.which, "step": run_.step, "learner": run_.named,
               "data": str(args.data), "train": args.train, "expressions": len(exprs),
               "per_group": args.per_group, "limit": args.limit, "rows": rows}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "table.md").write_text(table + "\n")
    print(f"teacher-forced frame errors of {args.run_dir} ({args.which}, step {run_.step}, learner {run_.named}) "
          f"on {len(exprs)} expressions of {args.data}")
    print(table)
    print(f"wrote {out / 'frames.parquet'}, {out / 'summary.json'} and {out / 'table.md'}")
    return 0
