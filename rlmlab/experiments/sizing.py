"""Sizing a threshold sweep before running it (`rlmlab run sweep --plan`).

Per threshold, from the pool's columns and per-call statistics (no example is built, no model
run): training expressions, examples and positions per epoch for both learners, what a step
holds and how many epochs the step budget is, the widest frame and the longest trace against
the model's positional tables, and the tokens each evaluation set makes a learner generate.
CPU hours are estimates scaled from the committed `paper-cpu` runs at L = 595 (docs/sweep.md).

What a learner trains on, in positions (an example of n tokens takes n - 1 positions):
- CoT: one example per expression, its whole trace: trace_len - 1;
- RM (lane-packed, `rlmlab.learning.examples.rm_lanes_packing`): one example per frame instance,
  holding the frame's call payload, everything the frame writes (its call blocks included) and
  one returned value per child it calls (`TraceStats.lane_tokens`; tests check it against the built
  examples).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rlmlab.errors import ConfigError, DataError
from rlmlab.learning.learner import get_learner
from rlmlab.task.expr import Call, parse, size
from rlmlab.task.library import Library
from rlmlab.task.taskfile import Task
from rlmlab.task.trace import trace_stats

# --- per-expression statistics ---------------------------------------------------------------

@dataclass(frozen=True)
class LaneStats:
    """An expression's RM training examples in lane form."""

    tokens: int
    """Lane tokens over all its frame instances (`len(lane_pack(...))`)."""
    frames: int
    """Frame instances: RM training examples."""
    longest: int
    """Tokens of its longest frame lane."""
    prompt: int
    """Tokens of the written expression."""


def lane_stats(expr: Call | str, library: Library) -> LaneStats:
    q = parse(expr, library) if isinstance(expr, str) else expr
    s = trace_stats(q, library)
    return LaneStats(s.lane_tokens, s.n_frame_instances, s.longest_lane, size(q))


def pool_lane_columns(texts: list[str], library: Library, progress: bool = False) -> dict[str, np.ndarray]:
    """`lane_stats` of every expression, as arrays (lane tokens, frames, longest lane, prompt)."""
    out = {k: np.zeros(len(texts), dtype=np.int64) for k in ("lane_tokens", "frames", "longest_lane", "prompt")}
    it = enumerate(texts)
    if progress:
        from tqdm import tqdm

        it = tqdm(it, total=len(texts), unit="expr", desc="lane statistics", dynamic_ncols=True)
    for i, text in it:
        s = lane_stats(text, library)
        out["lane_tokens"][i], out["frames"][i], out["longest_lane"][i], out["prompt"][i] = (
            s.tokens, s.frames, s.longest, s.prompt)
    return out


# --- cost model ------------------------------------------------------------------------------

# Work per position of the `cpu` model outside attention, in units of one attended key. The
# matrix products alone would be ~6·128 (24 d^2 flops against 4 d per key, d = 128); 1,400 is
# what training steps measured on this CPU at L = 595, 1,060 and 1,839 give
# (benchmarks/bench_sweep_steps.py, docs/sweep.md): attention runs closer to its flops than the
# small matrix products and the per-position overheads do.
CPU_MODEL_KEYS = 1400
DENSE_ROW = {"cot": 512, "rm": 128}
"""Packed-row lengths (`rlmlab.learning.packing`): RM's rows of 128 attend with a dense mask
over the whole row; CoT's rows of 512, and a longer trace's row of its own, attend by blocks
(causal within each example), so a CoT position attends to half its own example on average."""

# The step-budgeted paper-cpu runs at L = 595 (results/length-595-paper-cpu-steps): CPU seconds
# per step on one thread, validation included (RM 2,768 s for 6,000 steps, CoT 6,390 s for
# 24,000; `cpu_s` in their metrics.jsonl).
REFERENCE = {"rm": {"cpu_s_per_step": 0.46, "threshold": ("length", 595)},
             "cot": {"cpu_s_per_step": 0.27, "threshold": ("length", 595)}}
# Their evaluation sets (3,100 expressions): seconds to decode, 1 thread.
REFERENCE_DECODE_S = {"rm": 328.0, "cot": 435.0}


def sized_as(learner: str) -> str:
    """Which of the two sized observations a learner reads: "cot" (the whole trace) or "rm" (the
    active frame), from its observation, whatever its name carries ("cot@rope" reads the whole
    trace). Another observation is not sized: a one-line ConfigError."""
    name = get_learner(learner).observation.name
    if name not in ("cot", "rm"):
        raise ConfigError(f"--plan sizes learners that read the whole trace or the active frame, not {learner!r}")
    return name


def step_work(spans: np.ndarray, batch: int, learner: str) -> float:
    """Relative work of one step of `batch` examples drawn from examples that occupy `spans`
    positions each."""
    keys = spans / 2 if learner == "cot" else np.full(len(spans), float(DENSE_ROW["rm"]))
    return batch * float((spans * (CPU_MODEL_KEYS + keys)).mean())


def decode_work(generated: np.ndarray, prompt: np.ndarray, widest: np.ndarray, learner: str) -> float:
    """Relative work of decoding canonical traces: per generated token the model's own work plus
    its context, the prefix for CoT (cached keys) and the active frame for RM."""
    if learner == "cot":
        context = prompt + generated / 2
    else:
        context = widest / 2
    return float((generated * (CPU_MODEL_KEYS + context)).sum())


# --- the plan --------------------------------------------------------------------------------

def _model_tables(preset) -> dict[str, int]:
    from rlmlab.learning.config import MODEL_PRESETS

    return {v: MODEL_PRESETS[preset.model][v]["block_size"] for v in ("rm", "cot")}


def _threshold_rows(pool, ids: dict[int, int], kind: str, t: int, p) -> dict:
    """Row indices (into the pool; `ids` maps a pool id to its row) of one split's train, val and
    eval tables."""
    from rlmlab.experiments.splits import threshold_split

    s = threshold_split(pool, kind, t, n_val=p.n_val, per_bin_cap=p.per_bin_cap, n_train=p.n_train)
    take = {name: np.array([ids[int(i)] for i in table.column("id").to_pylist()], dtype=np.int64)
            for name, table in (("train", s.train), ("val", s.val), ("eval", s.eval))}
    take["ood"] = np.array(s.eval.column("ood").to_pylist(), dtype=bool)
    take["params"] = s.params
    return take


def size_threshold(cols: dict, rows: dict, preset, learners, kind: str, t: int) -> dict:
    """Every number of one threshold's plan row (see `plan_sweep`)."""
    tables = _model_tables(preset)
    tr, ev = rows["train"], rows["eval"]
    trace, width = cols["trace_len"], cols["max_frame_width"]
    out = {"split": kind, "threshold": t, "n_train": len(tr), "t_max": int(width[tr].max()),
           "train_longest_trace": int(trace[tr].max()), "eval_n": len(ev), "eval_ood": int(rows["ood"].sum()),
           "eval_widest_frame": int(width[ev].max()), "eval_longest_trace": int(trace[ev].max()),
           # A learner reads at most its table: CoT the trace before its last token, RM the active frame before it.
           "eval_beyond": {"rm": int((width[ev] - 1 > tables["rm"]).sum()),
                           "cot": int((trace[ev] - 1 > tables["cot"]).sum())},
           "train_dropped": {"cot": int((trace[tr] - 1 > tables["cot"]).sum()),
                             "rm": int((width[tr] > tables["rm"]).sum())},
           "learners": {}}
    generated = (trace[ev] - cols["prompt"][ev]).astype(np.int64)
    out["eval_generated"] = int(generated.sum())
    for learner in learners:
        family = sized_as(learner)
        train = preset.run_config(learner, "", "").train
        batch, steps = train.batch_size, train.max_steps
        if family == "cot":
            spans = trace[tr] - 1
            examples = len(tr)
            tokens = int(trace[tr].sum())
        else:
            # Per frame instance; the mean lane positions per example is what a step's budget multiplies.
            examples = int(cols["frames"][tr].sum())
            tokens = int(cols["lane_tokens"][tr].sum())
            spans = None
        total_positions = tokens - examples
        mean_positions = total_positions / examples
        step_positions = batch * mean_positions
        steps_per_epoch = examples / batch
        if family == "cot":
            work = step_work(spans, batch, "cot")
        else:
            # Lanes are ~30 positions, inside RM's dense 128-position rows: work per position is flat.
            work = step_positions * (CPU_MODEL_KEYS + DENSE_ROW["rm"])
        out["learners"][learner] = {"batch": batch, "steps": steps, "examples": examples, "tokens": tokens,
                                 "positions": total_positions, "step_positions": round(step_positions),
                                 "steps_per_epoch": steps_per_epoch,
                                 "epochs": None if steps is None else steps / steps_per_epoch,
                                 "step_work": work,
                                 "decode_work": decode_work(generated, cols["prompt"][ev], width[ev], family)}
    return out


def calibrate(rows: list[dict], reference: dict) -> None:
    """Attach CPU seconds to every learner of `rows` by scaling the reference runs' measured
    costs with the relative work of a step and of the evaluation set; `reference` holds the
    sized row of the reference threshold."""
    for r in rows:
        for learner, lv in r["learners"].items():
            family = sized_as(learner)
            ref = reference["learners"].get(learner) or reference["learners"].get(family)
            if ref is None:
                continue
            lv["cpu_s_per_step"] = REFERENCE[family]["cpu_s_per_step"] * lv["step_work"] / ref["step_work"]
            lv["decode_s"] = REFERENCE_DECODE_S[family] * lv["decode_work"] / ref["decode_work"]
            train_s = None if lv["steps"] is None else lv["steps"] * lv["cpu_s_per_step"]
            lv["cpu_hours"] = None if train_s is None else (train_s + lv["decode_s"]) / 3600


def load_plan_pool(preset, out: Path, pool: str | None, progress: bool, task):
    from rlmlab.task.pool import build_pool, read_pool

    if pool is not None:
        table = read_pool(pool, task=task)
    elif (out / "data" / f"pool-{preset.pool_n}-s{preset.pool_seed}.parquet").exists():
        table = read_pool(out / "data" / f"pool-{preset.pool_n}-s{preset.pool_seed}.parquet", task=task)
    else:
        table = build_pool(preset.pool_n, preset.pool_seed, progress=progress, task=task)
    meta = (table.schema.metadata or {}).get(b"rlmlab.task.pool")
    if meta is not None:
        import json

        info = json.loads(meta.decode())
        if (info.get("n"), info.get("seed")) != (preset.pool_n, preset.pool_seed):
            raise DataError(f"{pool}: a pool of {info.get('n')} expressions from seed {info.get('seed')}, but the "
                            f"preset draws its splits from {preset.pool_n} from seed {preset.pool_seed}")
    for c in ("id", "trace_len", "max_frame_width"):
        if c not in table.column_names:
            raise DataError(f"{pool}: not a pool (no {c!r} column)")
    return table


def size_sweep(preset, out: Path, learners, lengths=None, depths=None, pool: str | None = None,
               progress: bool = False, *, task: Task) -> list[dict]:
    """The sized rows of every threshold asked for (default: the paper's), with CPU estimates;
    `task` is the preset's, as the command resolved it."""
    from rlmlab.experiments.splits import DEPTH_THRESHOLDS, LENGTH_THRESHOLDS

    if lengths is None and depths is None:
        lengths, depths = LENGTH_THRESHOLDS, DEPTH_THRESHOLDS
    table = load_plan_pool(preset, Path(out), pool, progress, task)
    cols = {"trace_len": np.asarray(table.column("trace_len").to_numpy(), dtype=np.int64),
            "max_frame_width": np.asarray(table.column("max_frame_width").to_numpy(), dtype=np.int64)}
    cols.update(pool_lane_columns(table.column("expr").to_pylist(), task.library, progress))
    ref_kind, ref_t = REFERENCE["rm"]["threshold"]
    wanted = [("length", t) for t in dict.fromkeys(lengths or ())] + [("depth", t) for t in dict.fromkeys(depths or ())]
    ids = {int(i): k for k, i in enumerate(table.column("id").to_pylist())}
    if len(ids) != table.num_rows:
        raise DataError(f"{pool or out}: the pool's ids are not distinct")
    sized = {}
    for kind, t in wanted + ([] if (ref_kind, ref_t) in wanted else [(ref_kind, ref_t)]):
        sized[(kind, t)] = size_threshold(cols, _threshold_rows(table, ids, kind, t, preset), preset, learners, kind, t)
    rows = [sized[k] for k in wanted]
    calibrate(rows, sized[(ref_kind, ref_t)])
    return rows


def _m(x: float) -> str:
    return f"{x / 1e6:.1f}M"


def plan_table(rows: list[dict], preset) -> str:
    """Markdown of `size_sweep`'s rows: the data and limits per threshold, then per learner."""
    tables = _model_tables(preset)
    md = ["| split | threshold | training expr. | T_max | longest training trace | eval expr. (OOD) | "
          f"widest eval frame (RM table {tables['rm']}) | longest eval trace (CoT table {tables['cot']}) | "
          "eval beyond RM / CoT table | tokens to generate (eval) |",
          "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        md.append(f"| {r['split']} | {r['threshold']} | {r['n_train']:,} | {r['t_max']} | "
                  f"{r['train_longest_trace']:,} | "
                  f"{r['eval_n']:,} ({r['eval_ood']:,}) | {r['eval_widest_frame']} | {r['eval_longest_trace']:,} | "
                  f"{r['eval_beyond']['rm']} / {r['eval_beyond']['cot']} | {_m(r['eval_generated'])} |")
    learners = list(dict.fromkeys(v for r in rows for v in r["learners"]))
    md += ["", "| split | threshold | learner | examples / epoch | tokens / epoch | positions / step | steps / epoch | "
           "step budget | epochs | CPU s / step | eval decoding (CPU min) | CPU hours |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for v in learners:
            lv = r["learners"][v]
            dropped = r["train_dropped"]["cot" if v == "cot" else "rm"]
            md.append(f"| {r['split']} | {r['threshold']} | {v} | {lv['examples']:,} | {_m(lv['tokens'])} | "
                      f"{lv['step_positions']:,} | {lv['steps_per_epoch']:,.0f} | "
                      f"{'–' if lv['steps'] is None else format(lv['steps'], ',')} | "
                      f"{'–' if lv['epochs'] is None else format(lv['epochs'], '.2f')} | "
                      f"{lv.get('cpu_s_per_step', math.nan):.2f} | {lv.get('decode_s', math.nan) / 60:.0f} | "
                      f"{'–' if lv.get('cpu_hours') is None else format(lv['cpu_hours'], '.1f')} |"
                      + (f" ({dropped} training examples beyond the table, dropped)" if dropped else ""))
    return "\n".join(md) + "\n"


def plan_sweep(preset, out: Path, learners, lengths=None, depths=None, pool: str | None = None,
               progress: bool = False, *, task: Task) -> str:
    """`rlmlab run sweep --plan`: the sizing table of the thresholds a run would train."""
    return plan_table(size_sweep(preset, out, learners, lengths, depths, pool, progress, task=task), preset)
