import hashlib
import json
import os
import random

# Under pytest-xdist each worker is a process of its own: with one thread each, the workers'
# OpenMP threads do not spin on each other's cores (two two-thread workers on two cores ran the
# suite 2.5x slower). Set before numpy and torch start their thread pools.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

from rlmlab.cli import main
from rlmlab.task.sampler import ExpressionSampler
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")


def pytest_collection_modifyitems(config, items):
    """Under `--dist loadgroup`, the tests of a file that shares a module-scoped fixture (a trained
    model, a Ray head) run on one worker, so the fixture is built once; every other test is spread
    on its own, so one long file (tests/test_experiments.py) does not hold one worker for minutes."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d.scope == "module" for chain in defs for d in chain):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


def sample_expressions(n: int, seed: int):
    sampler, rng = ExpressionSampler(library=PAPER.library), random.Random(seed)
    return [sampler.sample(rng) for _ in range(n)]



def one_line_error(capsys, argv: list[str], from_command: bool = True) -> str:
    """Run `rlmlab ARGV`, which must fail with status 2 and one line on stderr, no traceback;
    with `from_command`, a line of the command's own (`rlmlab CMD: error: ...`) rather than a
    usage error. Returns the line."""
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    if from_command:
        assert err.startswith(f"rlmlab {argv[0]}: error: "), err
    return err

@pytest.fixture(scope="session")
def random_exprs():
    """1,000 expressions from the paper's generator (seed 0)."""
    return sample_expressions(1000, 0)


@pytest.fixture
def one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a shared machine a busy core
    stalls every op of a two-thread run (10-30x slower); restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Recorder:
    """Wraps a ModelPredictor: keeps each step's feeds (copied) and logits."""

    def __init__(self, inner):
        self.inner, self.block_size, self.log = inner, inner.block_size, []
        self.position_index = getattr(inner, "position_index", None)

    def reset(self, n_slots):
        self.inner.reset(n_slots)

    def __call__(self, feeds):
        out = self.inner(feeds)
        self.log.append(([(f.slot, list(f.seq)) for f in feeds], self.inner.logits.clone()))
        return out


def reseal_examples_cache(path, **arrays) -> None:
    """Replace arrays of a training-examples cache (.npz) and re-seal it with a matching SHA-256, so that only
    the loader's shape and type checks can refuse it."""
    z = dict(np.load(path))
    z.update(arrays)
    meta = json.loads(str(z["meta"]))
    h = hashlib.sha256()
    for k in ("ids", "loss", "offsets", "source", "layout"):
        if k in z:
            h.update(f"{z[k].dtype.str}{z[k].shape}".encode())
            h.update(np.ascontiguousarray(z[k]).tobytes())
    meta["sha256"] = h.hexdigest()
    z["meta"] = np.array(json.dumps(meta))
    with open(path, "wb") as f:
        np.savez(f, **z)


def draw_packed_layout(data, max_len: int):
    """(row, start, length) tensors of a random packing: one to three rows of up to `max_len`
    positions, each holding blocks of any length, possibly none (then one block fills row 0)."""
    import torch
    from hypothesis import strategies as st

    B = data.draw(st.integers(1, 3))
    T = data.draw(st.integers(1, max_len))
    row, start, length = [], [], []
    for r in range(B):
        t = 0
        while t < T and data.draw(st.booleans()):
            n = data.draw(st.integers(1, T - t))
            row.append(r), start.append(t), length.append(n)
            t += n
    if not row:
        row, start, length = [0], [0], [T]
    return B, T, *(torch.tensor(a) for a in (row, start, length))


def write_as_legacy(ckpt) -> None:
    """Rewrite a checkpoint as format /1 wrote it: no digest, the learner and `data.learner`
    under their old name "view", and tensor files whose header names format /1."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    from rlmlab.learning import checkpoint as ck

    meta = json.loads((ckpt / ck.META_FILE).read_text())
    for name in meta["files"]:
        path = ckpt / name
        with safe_open(str(path), "pt") as f:
            header, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
        save_file(tensors, str(path), metadata={**header, "format": ck.LEGACY_FORMAT})
        meta["files"][name] = hashlib.sha256(path.read_bytes()).hexdigest()
    learner = meta.pop("learner", None) or meta.pop("view")
    data = meta["config"].get("data")
    if isinstance(data, dict) and "learner" in data:
        data["view"] = data.pop("learner")
    meta = {k: v for k, v in meta.items() if k != "digest"} | {"format": ck.LEGACY_FORMAT, "view": learner}
    (ckpt / ck.META_FILE).write_text(json.dumps(meta, indent=1))
