"""CPU seconds per training step: the CPU path compared across two checkouts on a busy machine.

    python benchmarks/bench_step_cpu.py ROOT LEARNER PRESET STEPS
    # before/after a change, interleaved, e.g. an old commit unpacked into /tmp/base:
    for i in 1 2 3; do for tree in /tmp/base .; do for v in rm cot; do
        OMP_NUM_THREADS=1 python benchmarks/bench_step_cpu.py $tree $v small 6; done; done; done

Runs the `train_step` of the rlmlab found at ROOT (one thread, seed-42 pool of 400
expressions, the learner's training row length, batch 64 examples' worth of positions) after a
warm-up step, and reports the process's CPU time per step. Unlike wall-clock tokens/s
(`bench_train.py`), CPU time hardly moves when other jobs share the cores, so two checkouts can
be compared under load; interleave the runs so that both see the same conditions.
"""

import os
import sys
import time

root, learner, preset_name, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
sys.path.insert(0, os.path.abspath(root))

import torch  # noqa: E402

torch.set_num_threads(1)

import rlmlab  # noqa: E402
from rlmlab.learning.config import DataSettings, TrainConfig  # noqa: E402
from rlmlab.learning.model import Transformer, preset  # noqa: E402
from rlmlab.learning.packing import RowStream  # noqa: E402

try:
    from rlmlab.learning.data import fit_to_block
    from rlmlab.learning.optim import configure_optimizer
    from rlmlab.learning.step import train_step
except ImportError:  # a checkout from before the trainer was split into modules (8cb4743 and older)
    from rlmlab.learning.train import configure_optimizer, fit_to_block, train_step
from rlmlab.learning.examples import build_examples  # noqa: E402
from rlmlab.task.pool import build_pool  # noqa: E402
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

assert rlmlab.__file__.startswith(os.path.abspath(root)), f"imported {rlmlab.__file__}, not the one under {root}"
vocab = PAPER.vocab
data = build_examples(build_pool(400, 42, workers=1, task=PAPER).column("expr").to_pylist(), learner, vocab, workers=1, task=PAPER)
torch.manual_seed(0)
model = Transformer(preset(preset_name, learner, len(vocab)))
data, _ = fit_to_block(data, model.cfg.block_size, True, "benchmark")
tc = TrainConfig(max_steps=1)
optimizer = configure_optimizer(model, tc)
stream = RowStream(data.lengths - 1, DataSettings(learner=learner).row_length, 0)
step_tokens = round(tc.batch_size * float((data.lengths - 1).mean()))
cpu = torch.device("cpu")
train_step(model, model, optimizer, data, stream.take(step_tokens // 8), vocab.pad_id, tc, cpu)
t0, w0, tokens = time.process_time(), time.perf_counter(), 0
for _ in range(steps):
    _, n, _ = train_step(model, model, optimizer, data, stream.take(step_tokens), vocab.pad_id, tc, cpu)
    tokens += n
c, w = time.process_time() - t0, time.perf_counter() - w0
print(f"{os.path.abspath(root)} {learner} {preset_name}: {c / steps:.4f} CPU s/step, "
      f"{tokens / c:,.0f} useful tokens per CPU second, {tokens / w:,.0f} per wall second, "
      f"load {os.getloadavg()[0]:.1f}", flush=True)
