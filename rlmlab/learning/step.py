"""One optimizer step and one validation pass: packed rows to micro-batches on the device,
forward and backward, clipping and the AdamW update.

A training step never waits for the device (docs/gpu.md): batches and their attention masks
are built on the host and moved once, loss and gradient norm stay on the device and are read
at log points, and a non-finite step is skipped on the device (AdamW's `found_inf`) and
reported at the next read (`FiniteGuard`), before anything is validated or saved. So on CUDA
the host builds the next step's batches while the device still computes this one. On CUDA the
micro-batches are rows of one fixed length attended with FlexAttention (`rlmlab.attention.backends.attention_kind`),
which keeps a compiled model to one graph.
"""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F

from rlmlab.attention.positions import context_limit
from rlmlab.errors import ConfigError, TrainingDiverged
from rlmlab.learning.config import TrainConfig
from rlmlab.learning.examples import ExampleSet
from rlmlab.learning.model import Transformer
from rlmlab.learning.packing import IGNORE, PackedBatch, Row, collate, flat_micro_batches, micro_batches

OFFSET_STREAM = 2  # third seed word of the start-offset draws (the data order uses [seed, epoch])


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"train.device={name} but CUDA is not available")
    return torch.device(name)


def autocast_for(device: torch.device):
    # bf16 on CUDA (no loss scaling needed); CPU bf16 matmuls are far slower than fp32 there.
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def flat_length(tc: TrainConfig, longest: int, step_tokens: int | None = None) -> int:
    """Positions of every micro-batch row on the "flex" path, in whole FlexAttention tiles: a
    whole step (`step_tokens`, plus the most its last row can overshoot it: `longest`, the
    longest row's content) when `micro_batch_tokens` allows, so that a step is one forward
    pass; else `micro_batch_tokens`, at least `longest`."""
    whole = step_tokens + longest if step_tokens is not None else None
    n = whole if whole is not None and whole <= tc.micro_batch_tokens else max(tc.micro_batch_tokens, longest)
    return -(-n // 128) * 128


def step_batches(data: ExampleSet, rows: list[Row], pad_id: int, tc: TrainConfig, device: torch.device,
                 attention: str, block_size: int | None, flat_len: int | None = None,
                 shift: np.random.Generator | None = None) -> list[PackedBatch]:
    """`rows` as micro-batches on `device`, masks included, all built on the host. On the
    "flex" path every micro-batch is one row of `flat_len` positions (default:
    `flat_length(tc, block_size)`). `block_size`: the model's context limit (None: none).
    `shift`: draws the examples' start offsets when `tc.start_offset` is on (None: all at 0)."""
    if attention == "flex":
        flat_len = flat_len or flat_length(tc, block_size if block_size is not None else max(r.length for r in rows))
        groups = [[r] for r in flat_micro_batches(rows, data.lengths - 1, flat_len)]
    else:
        groups = micro_batches(rows, tc.micro_batch_tokens)
    return [collate(data.ids, data.loss, data.offsets, mb, pad_id, data.layout, block_size, shift,
                    tc.start_offset).prepare(device, attention)
            for mb in groups]


def offset_draws(tc: TrainConfig, step: int) -> np.random.Generator | None:
    """The generator of step `step`'s start offsets (None when `train.start_offset` is off): a
    function of the seed and the step alone, so that a resumed run draws what it would have."""
    return np.random.default_rng([tc.seed, step, OFFSET_STREAM]) if tc.start_offset else None


def batch_loss(fwd, batch: PackedBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy over the batch's targets, logits)."""
    attn = batch.attn if batch.attn is not None else batch.attention()
    with autocast_for(device):
        logits = fwd(batch.idx, pos=batch.pos, attn=attn)  # (B, T, V)
    logits = logits.float()
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), batch.targets.view(-1), ignore_index=IGNORE,
                           reduction="sum")
    return loss, logits


@torch.no_grad()
def validation_metrics(fwd, batches: list[PackedBatch], n_examples: int, device: torch.device) -> dict[str, float]:
    """Teacher-forced loss per target token, per-token accuracy and whole-example accuracy
    (`batches` on the host, or prepared on `device`; read back once, at the end)."""
    losses, hits = [], []
    n_targets = 0
    wrong_example = torch.zeros(n_examples + 1, dtype=torch.bool, device=device)  # last slot: padding
    for b in batches:
        b = b if b.attn is not None else b.to(device)
        loss, logits = batch_loss(fwd, b, device)
        is_target = b.targets != IGNORE
        hit = (logits.argmax(-1) == b.targets) & is_target
        losses.append(loss)
        hits.append(hit.sum())
        n_targets += b.n_targets
        miss_doc = torch.where(is_target & ~hit, b.doc, n_examples)
        wrong_example[miss_doc.view(-1)] = True
    per_batch = torch.stack(losses).tolist()
    correct = int(torch.stack(hits).sum())
    loss_sum = 0.0
    for x in per_batch:  # summed on the host in batch order, as the numbers were before
        loss_sum += x
    return {"loss": loss_sum / n_targets, "token_acc": correct / n_targets,
            "example_acc": 1.0 - int(wrong_example[:n_examples].sum()) / n_examples}


class FiniteGuard:
    """Which optimizer step first had a non-finite loss or gradient norm, kept on the device.

    From that step on, AdamW skips every update (its `found_inf`, as under a gradient scaler),
    so the weights and moments stay those of the last good step without the host waiting for
    the check; `check` reads the record (one wait) and raises TrainingDiverged. The trainer
    checks at every log point and before anything is validated or saved, so no checkpoint
    holds a step after the bad one."""

    def __init__(self, device: torch.device, step: int = 0):
        self.found = torch.zeros((), device=device)  # 1.0 once a step was bad: AdamW's found_inf
        self.bad = torch.tensor([-1.0, math.nan, math.nan], dtype=torch.float64, device=device)  # step, loss, norm
        self.step = step  # optimizer steps recorded so far

    def record(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        """The loss and gradient norm of step `self.step + 1`, before its update."""
        self.step += 1
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        first = bad & (self.found == 0)
        # new_full is a fill on the device: a tensor from a host number would be a (waiting) copy.
        now = torch.stack([loss.new_full((), float(self.step), dtype=torch.float64), loss.double(),
                           grad_norm.double()])
        self.bad = torch.where(first, now, self.bad)
        self.found = torch.maximum(self.found, bad.to(self.found.dtype))

    def check(self) -> int | None:
        """Raise TrainingDiverged if a recorded step was not finite (`last_good` then says the
        step whose weights the model still holds)."""
        step, loss, norm = self.bad.tolist()
        if step < 0:
            return None
        self.last_good = int(step) - 1
        raise TrainingDiverged(f"non-finite training loss or gradient at step {int(step)} (loss {loss}, "
                               f"gradient norm {norm})")


def train_step(fwd, model: Transformer, optimizer, data: ExampleSet, rows: list[Row], pad_id: int,
               tc: TrainConfig, device: torch.device, attention: str = "blocks",
               guard: FiniteGuard | None = None, flat_len: int | None = None,
               shift: np.random.Generator | None = None) -> tuple[torch.Tensor, int, torch.Tensor]:
    """One optimizer step over `rows`: (mean target loss, example positions, gradient norm),
    loss and norm as 0-d tensors on `device`, read by nobody here: the host does not wait.

    A step whose loss or gradient is not finite leaves weights and optimizer untouched; with a
    `guard` it is recorded there for the caller to check later, without one it raises
    TrainingDiverged at once (a wait). `shift`: as in `step_batches`."""
    batches = step_batches(data, rows, pad_id, tc, device, attention, context_limit(model.cfg), flat_len, shift)
    mean, grad_norm = optimizer_step(fwd, model, optimizer, batches, tc, device, guard)
    return mean, sum(b.n_tokens for b in batches), grad_norm


def optimizer_step(fwd, model: Transformer, optimizer, batches: list[PackedBatch], tc: TrainConfig,
                   device: torch.device, guard: FiniteGuard | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The device half of `train_step`: forward and backward over prepared `batches`, clipping
    and the AdamW update. Reads no device value unless `guard` is None."""
    n_targets = sum(b.n_targets for b in batches)
    total = torch.zeros((), device=device)
    for b in batches:
        loss, _ = batch_loss(fwd, b, device)
        (loss / n_targets).backward()  # the step's mean over targets, however the rows are split
        total += loss.detach()
    clip = tc.grad_clip if tc.grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip, foreach=True)  # a few kernels, not 2 per tensor
    mean = total.double() / n_targets  # as the host would divide: a float64 of the float32 sum
    checked_now = guard is None
    if checked_now:
        guard = FiniteGuard(device)
    guard.record(mean, grad_norm)
    optimizer.found_inf = guard.found  # a bad step is skipped on the device
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if checked_now:
        guard.check()
    return mean, grad_norm
