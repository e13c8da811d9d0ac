"""What a trained learner reads at the answer of the hidden-literal expressions it was scored on
(rlmlab/shortcuts/readout.py): the answer token after the full canonical prefix, after RM's root
frame alone, and after the same prefix with the helper swapped for one that binds another k.

    python benchmarks/readout_hidden_literal.py RUN_DIR [--folder EXPERIMENT] [--out FILE.json]

RUN_DIR is a trained run with a `best` checkpoint (or `last` with `--which last`, e.g. the
weights a resumable export carries), e.g. `runs/shortcuts-steps/shortcut-hidden_literal/cot`; the IID and OOD expressions are read from the
evaluation records of EXPERIMENT (default: the experiment folder above RUN_DIR; an exported
`results/...` folder works too), `shortcut-<construction>/<any learner>/eval/{iid,ood}`. Teacher
forced, three predictions per expression: about 30 CPU seconds for 600 expressions (26.7 for
the `cpu` CoT on hidden_literal, 2026-12-03).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

from rlmlab.errors import RlmlabError  # noqa: E402
from rlmlab.shortcuts import get_construction  # noqa: E402
from rlmlab.shortcuts.hidden_literal import HiddenLiteral  # noqa: E402
from rlmlab.shortcuts.readout import readout, readout_summary  # noqa: E402

ROWS = (("in_context_answer", "answer after the full prefix"),
        ("in_context_signal", "S (= k) after the full prefix"),
        ("frame_alone_answer", "answer after RM's root frame alone"),
        ("frame_agrees", "frame alone = full prefix"),
        ("swapped_answer", "helper swapped: answer"),
        ("swapped_new_signal", "helper swapped: the new k'"),
        ("swapped_old_signal", "helper swapped: the old k"))


def eval_rows(folder: Path, name: str, part: str) -> list[dict]:
    from rlmlab.measuring.result_files import read_results

    for d in sorted((folder / f"shortcut-{name}").glob(f"*/eval/{part}")):
        if (d / "summary.json").exists():
            return read_results(d, traces=False)
    raise RlmlabError(f"{folder}: no evaluation records of shortcut-{name} on {part}")


def cell(s: dict) -> str:
    if not s["n"]:
        return "–"
    lo, hi = s["ci95"]
    return f"{s['k']}/{s['n']} = {100 * s['rate']:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--folder", type=Path, help="experiment folder with the evaluation records")
    ap.add_argument("--construction", help="hidden_literal or hidden_literal_late (default: from RUN_DIR)")
    ap.add_argument("--which", default="best", help="checkpoint: best or last")
    ap.add_argument("--seed", type=int, default=0, help="order in which donor helpers are tried")
    ap.add_argument("--limit", type=int, help="first N expressions of each set only (a quick look)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, help="write the summary and per-expression rows as JSON")
    args = ap.parse_args()
    import torch

    from rlmlab.attention.positions import context_limit
    from rlmlab.decoding.engine import ModelPredictor
    from rlmlab.learning.checkpoint import load_run

    try:
        if args.threads < 1:
            raise RlmlabError(f"--threads must be at least 1, got {args.threads}")
        if args.limit is not None and args.limit < 1:
            raise RlmlabError(f"--limit must be at least 1, got {args.limit}")
        name = args.construction or args.run_dir.resolve().parent.name.removeprefix("shortcut-")
        c = get_construction(name)
        if not isinstance(c, HiddenLiteral):
            raise RlmlabError(f"{name} is not a hidden-literal construction")
        folder = args.folder or args.run_dir.resolve().parent.parent
        if args.out is not None and (args.out.is_dir() or not args.out.parent.is_dir()):
            raise RlmlabError(f"--out {args.out}: not a file in an existing folder")
        run = load_run(args.run_dir, which=args.which)
        sets = {part: eval_rows(folder, name, part)[:args.limit] for part in ("iid", "ood")}
        torch.set_num_threads(args.threads)
        t0 = time.process_time()
        predictor = ModelPredictor(run.model)
        out = {part: readout(predictor, run.learner, c, rows, run.vocab, args.seed,
                             context_limit(run.model.cfg)) for part, rows in sets.items()}
    except RlmlabError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    cpu_s = time.process_time() - t0
    summary = {part: readout_summary(rows) for part, rows in out.items()}
    print_facts()
    print(f"{args.run_dir} ({run.named}, {args.which} checkpoint at step {run.step}), {name}, "
          f"expressions from {folder}; {cpu_s:.1f} CPU s")
    print()
    print("| answer-token prediction | IID | OOD |")
    print("|---|---|---|")
    for key, label in ROWS:
        print(f"| {label} | {cell(summary['iid'][key])} | {cell(summary['ood'][key])} |")
    if args.out is not None:
        meta = {"run_dir": str(args.run_dir), "which": args.which, "step": run.step, "learner": run.named,
                "construction": name, "folder": str(folder), "seed": args.seed, "limit": args.limit}
        args.out.write_text(json.dumps({**meta, "summary": summary, "rows": out}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
