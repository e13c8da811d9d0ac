"""A construction's data set: training, validation, IID and OOD tables with S beside each
answer, its validity report, and its folder on disk (parquet tables and `shortcut.json`)."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow as pa

from rlmlab.errors import ConfigError, DataError
from rlmlab.shortcuts.construction import PAPER_TASK, Construction, ShortcutConfig, ShortcutSampler, Side
from rlmlab.shortcuts.registry import get_construction
from rlmlab.shortcuts.root_frame import RootFrame, root_frame
from rlmlab.shortcuts.validity import ValidityLimits, check_validity
from rlmlab.task.expr import to_text
from rlmlab.task.pool import read_table_folder, write_table_folder
from rlmlab.task.trace import Execution

FORMAT = "rlmlab.shortcut/1"
N_IID = 300  # paper: n = 300 IID and 300 OOD evaluation expressions per construction
N_OOD = 300
N_VAL = 300

SCHEMA = pa.schema([
    ("id", pa.int64()), ("expr", pa.string()), ("root", pa.string()), ("type", pa.string()),
    ("value", pa.string()), ("signal", pa.string()), ("trace_len", pa.int32()), ("max_depth", pa.int16()),
    ("max_frame_width", pa.int32()), ("n_frame_examples", pa.int32()),
])


@dataclass
class ShortcutDataset:
    """One construction's data: training and validation sets, IID and OOD evaluation sets, and its
    validity report. No text is in two of train / val / iid / ood.

    Tables have the pool's columns plus `signal` (S(x) as a token), so the inference code that
    reads pools reads these too."""

    name: str
    """Construction name (a key of CONSTRUCTIONS or ABLATIONS)."""
    params: dict
    """Sizes, seed, sampler configuration, validity limits and the validity report."""
    train: pa.Table
    """Training examples: signal == value on every row."""
    val: pa.Table
    """Validation examples from the training distribution (checkpoint selection / plateau)."""
    iid: pa.Table
    """Held-out examples from the training distribution (no text shared with `train`)."""
    ood: pa.Table
    """OOD examples: signal != value on every row."""

    @property
    def report(self) -> dict:
        return self.params["validity"]

    @staticmethod
    def identity(params: dict) -> dict:
        """What of a data set's `params` the data determine: all of it but the wording of the
        validity checks' details, which follows the code's vocabulary (a saved record is compared
        with a rebuilt set through this)."""
        validity = params.get("validity")
        if not isinstance(validity, dict) or not isinstance(validity.get("checks"), list):
            return params
        checks = [{k: v for k, v in c.items() if k != "detail"} if isinstance(c, dict) else c
                  for c in validity["checks"]]
        return {**params, "validity": {**validity, "checks": checks}}

    def save(self, folder: str | Path) -> Path:

        return write_table_folder(folder, "shortcut.json", FORMAT, {"name": self.name, "params": self.params},
                                  {"train": self.train, "val": self.val, "iid": self.iid, "ood": self.ood})

    @classmethod
    def load(cls, folder: str | Path) -> "ShortcutDataset":

        meta, tables = read_table_folder(folder, "shortcut.json", FORMAT, PAPER_TASK)
        for t in ("train", "val", "iid", "ood"):
            if t not in tables:
                raise DataError(f"{folder}: shortcut data set has no {t!r} table")
            if "signal" not in tables[t].column_names:
                raise DataError(f"{folder}: table {t!r} has no 'signal' column")
        if "name" not in meta or "params" not in meta:
            raise DataError(f"{folder}: shortcut.json lacks the name or params")
        return cls(meta["name"], meta["params"], tables["train"], tables["val"], tables["iid"], tables["ood"])


def _row(i: int, ex: Execution, signal: str) -> dict:
    return {"id": i, "expr": to_text(ex.expr), "root": ex.expr.fn, "type": PAPER_TASK.infer_type(ex.expr),
            "value": ex.value_token, "signal": signal, "trace_len": ex.trace_len, "max_depth": ex.max_depth,
            "max_frame_width": ex.max_frame_width, "n_frame_examples": ex.n_frame_examples}


def _draw_set(c: Construction, split: Side, n: int, rng: random.Random, config: ShortcutConfig,
              exclude: set[str], bar=None) -> tuple[list[dict], list[RootFrame]]:
    """n distinct examples (texts not in `exclude`), with S checked against the answer; `bar`, a
    tqdm bar or None, counts the examples kept."""
    sampler = ShortcutSampler(c, rng, config)
    rows, roots, seen = [], [], set(exclude)
    attempts = 0
    while len(rows) < n:
        attempts += 1
        if attempts > n * 20 + 1000:
            raise DataError(f"{c.name}: only {len(rows)} distinct {split} examples found, {n} requested")
        expr = sampler.draw(split)
        text = to_text(expr)
        if text in seen:
            continue
        seen.add(text)
        ex = PAPER_TASK.execute(expr)
        sig = c.signal(ex.tokens, ex.prompt_len)
        if (sig == ex.value_token) != (split == "train"):
            raise DataError(f"{c.name}: {split} example {text} has S={sig} and answer {ex.value_token}")
        rows.append(_row(len(rows), ex, sig))
        roots.append(root_frame(ex, sig))
        bar and bar.update(1)
    return rows, roots


def build_shortcut_dataset(name: str, *, n_train: int = 10_000, n_val: int = N_VAL, n_iid: int = N_IID,
                           n_ood: int = N_OOD, seed: int = 0, config: ShortcutConfig = ShortcutConfig(),
                           limits: ValidityLimits = ValidityLimits(), check: bool = True,
                           progress: bool = False) -> ShortcutDataset:
    """Sample a construction's training, validation, IID and OOD sets and run the validity checks.

    Each set comes from its own RNG (seeded by name, set and `seed`) and holds distinct texts;
    validation and IID share no text with training or with each other. With `check=True` an invalid construction raises
    DataError naming the failed checks; with `check=False` the report is only recorded. `progress`
    shows a bar over the examples drawn (the paper-cpu sets take minutes).
    """
    c = get_construction(name)
    for label, n in (("n_train", n_train), ("n_val", n_val), ("n_iid", n_iid), ("n_ood", n_ood)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{label} must be a positive integer, got {n!r}")

    def rng(part: str) -> random.Random:
        return random.Random(f"rlmlab-shortcut:{name}:{part}:{seed}")

    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n_train + n_val + n_iid + n_ood, unit="expr", desc=f"data {name}", dynamic_ncols=True)
    train_rows, train_roots = _draw_set(c, "train", n_train, rng("train"), config, set(), bar)
    train_texts = {r["expr"] for r in train_rows}
    val_rows, _ = _draw_set(c, "train", n_val, rng("val"), config, train_texts, bar)
    iid_rows, _ = _draw_set(c, "train", n_iid, rng("iid"), config, train_texts | {r["expr"] for r in val_rows}, bar)
    ood_rows, ood_roots = _draw_set(c, "ood", n_ood, rng("ood"), config, train_texts, bar)
    bar and bar.close()
    report = check_validity(c, train_roots, ood_roots, limits)
    meta = {b"rlmlab.task.vocab": PAPER_TASK.vocab.to_json().encode()}
    params = {"construction": c.name, "title": c.title, "excluded": c.excluded, "seed": seed,
              "n_train": n_train, "n_val": n_val, "n_iid": n_iid, "n_ood": n_ood,
              "config": asdict(config), "limits": asdict(limits), "validity": report.to_dict()}
    if check:
        report.raise_if_invalid()
    return ShortcutDataset(c.name, params,
                           *(pa.Table.from_pylist(r, SCHEMA).replace_schema_metadata(meta)
                             for r in (train_rows, val_rows, iid_rows, ood_rows)))
