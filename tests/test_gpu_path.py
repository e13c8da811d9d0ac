"""The CUDA path, checked on CPU (docs/gpu.md): no host waits in a training step, one attention
call per layer, one compiled graph, a kernel budget, bf16 against fp32, and FlexAttention's
mask against the dense reference.

FlexAttention refuses gradients on CPU up front (torch 2.13 has no fused CPU backward); its
eager form, which computes every score under the same `mask_mod` the CUDA kernel reads,
differentiates fine there, so these tests lift that one refusal (`cpu_flex`). The eager form
ignores the block tables, which are checked on their own.
Under `FakeTensorMode` nothing is computed at all: any read of a device value by the host
(`.item()`, `bool()`, `.tolist()`, a data-dependent shape) raises, which is the point.
"""

import collections
import contextlib
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn.attention.flex_attention as flex
import torch.nn.functional as F
from conftest import draw_packed_layout
from hypothesis import given, settings
from hypothesis import strategies as st
from test_model import _dense_block_mask
from torch._dynamo.testing import CompileCounter
from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from rlmlab.attention.backends import attention_kind
from rlmlab.attention.flex import Flex
from rlmlab.attention.layout import Layout
from rlmlab.learning.config import DataSettings, ModelConfig, TrainConfig
from rlmlab.learning.data import fit_to_block
from rlmlab.learning.examples import build_examples
from rlmlab.learning.model import Transformer, preset
from rlmlab.learning.optim import configure_optimizer
from rlmlab.learning.packing import RowStream, collate, flat_micro_batches
from rlmlab.learning.step import FiniteGuard, batch_loss, optimizer_step, step_batches
from rlmlab.runlog import read_metrics
from rlmlab.task.pool import build_pool
from rlmlab.task.taskfile import load_task

PAPER = load_task("paper")

CPU = torch.device("cpu")
VOCAB = PAPER.vocab


@contextlib.contextmanager
def cpu_flex():
    """FlexAttention with gradients on CPU: its eager (materialising) form; see the module docstring."""
    with mock.patch.object(flex, "_validate_device", lambda q, k, v: None):
        yield


@pytest.fixture(scope="module")
def examples_of():
    """Real examples of both learners (IID pool, seed 42), and a step's worth of packed rows of each."""
    exprs = build_pool(40, 42, workers=1, task=PAPER).column("expr").to_pylist()
    out = {}
    for learner in ("cot", "rm"):
        data, _ = fit_to_block(build_examples(exprs, learner, VOCAB, workers=1, task=PAPER),
                               preset("tiny", learner, len(VOCAB)).block_size, True, "test")
        stream = RowStream(data.lengths - 1, DataSettings(learner=learner).row_length, 0)
        rows = stream.take(round(TrainConfig().batch_size * float((data.lengths - 1).mean())))
        out[learner] = (data, rows)
    return out


# --- FlexAttention's mask against the dense reference ------------------------------------


def _tiles(fm: Flex, B: int, T: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(listed, full) (B, nb, nb) bool: the tiles the block tables hand the kernel, and those it
    computes without the mask."""
    tb = fm.tables
    nb = -(-T // block)
    listed = np.zeros((B, nb, nb), dtype=bool)
    full = np.zeros((B, nb, nb), dtype=bool)
    for target, num, idx in ((listed, tb.kv_num_blocks, tb.kv_indices), (full, tb.full_kv_num_blocks, tb.full_kv_indices)):
        for b in range(B):
            for i in range(nb):
                for j in idx[b, 0, i, :int(num[b, 0, i])].tolist():
                    assert not listed[b, i, j] and not full[b, i, j], "a tile listed twice"
                    target[b, i, j] = True
    return listed | full, full


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_flex_mask_equals_the_dense_mask(data):
    """Random packed layouts with and without lanes: the FlexAttention output at example
    positions and every input gradient equal the dense mask's, and the block tables list every
    tile that holds an allowed pair and call full only tiles where every pair is allowed (the
    CUDA kernel trusts them; the eager form reads only `mask_mod`)."""
    B, T, row, start, length = draw_packed_layout(data, 160)
    block = data.draw(st.sampled_from([16, 32, 128]))
    frame = branch = None
    if data.draw(st.booleans()):
        frame = torch.tensor(data.draw(st.lists(st.integers(0, 2), min_size=B * T, max_size=B * T))).view(B, T)
        branch = torch.tensor(data.draw(st.lists(st.integers(-1, 1), min_size=B * T, max_size=B * T))).view(B, T)
    dense = _dense_block_mask(B, T, row, start, length, frame, branch)
    fm = Flex(Layout.packed(B, T, row, start, length, frame, branch), block=block)

    listed, full = _tiles(fm, B, T, block)
    nb = listed.shape[1]
    padded = torch.zeros(B, nb * block, nb * block, dtype=torch.bool)
    padded[:, :T, :T] = dense[:, 0]
    per_tile = padded.view(B, nb, block, nb, block)
    any_pair = per_tile.any(4).any(2).numpy()
    inside = np.zeros((B, nb * block), dtype=bool)
    inside[:, :T] = dense[:, 0].any(-1).numpy()
    inside = inside.reshape(B, nb, block)
    assert not (any_pair & ~listed).any(), "an allowed pair in a tile the kernel skips"
    # a full tile: every (query, key) pair of real positions allowed
    for b, i, j in zip(*np.nonzero(full)):
        q_real, k_real = inside[b, i], inside[b, j]
        assert per_tile[b, i, :, j, :].numpy()[np.ix_(q_real, k_real)].all()

    inside_t = dense[:, 0].any(-1)  # (B, T) positions of some example
    reference = dense | ~inside_t[:, None, :, None]  # padding rows: anything non-empty, unread
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, 2, T, 4, requires_grad=True) for _ in range(3))
    keep = inside_t[:, None, :, None]
    g = torch.randn(B, 2, T, 4) * keep
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=reference)
    with cpu_flex():
        out = flex.flex_attention(q, k, v, block_mask=fm.block_mask())
    torch.testing.assert_close(out * keep, ref * keep, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad((out * g).sum(), (q, k, v)), torch.autograd.grad((ref * g).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)



def _random_layout(rng: np.random.Generator, B: int, T: int, lanes: bool):
    """Examples of 1..T/2 positions end to end in each row, the last position of a row left as padding."""
    row, start, length = [], [], []
    for r in range(B):
        t = 0
        while t < T - 1:
            n = int(rng.integers(1, min(T // 2, T - 1 - t) + 1))
            row.append(r), start.append(t), length.append(n)
            t += n
    frame = torch.from_numpy(rng.integers(0, 3, (B, T))) if lanes else None
    branch = torch.from_numpy(rng.integers(-1, 2, (B, T))) if lanes else None
    return [torch.tensor(a) for a in (row, start, length)], frame, branch


def test_flex_tables_are_torchs_own_with_row_major_strides():
    """Without lanes the block tables are exactly what `create_block_mask` derives from the
    exact rule, tile for tile, and every table has the row-major strides of its shape. The
    compiled kernels index the tables by their own stride arithmetic (see `canonical`), so a
    table with the right values and other strides is read wrong: on CUDA it gave 15% wrong
    attention outputs while every value check passed."""
    rng = np.random.default_rng(0)
    for _ in range(6):
        B, T = int(rng.integers(1, 4)), int(rng.integers(130, 700))
        (row, start, length), _, _ = _random_layout(rng, B, T, lanes=False)
        ours = Flex(Layout.packed(B, T, row, start, length)).block_mask()
        theirs = flex.create_block_mask(ours.mask_mod, B, None, T, T, device="cpu")
        for name in ours._TENSOR_ATTRS:
            a, b = getattr(ours, name), getattr(theirs, name)
            if a is None and b is None:
                continue
            assert torch.equal(a, b), name
            assert a.stride() == torch.empty(a.shape).stride(), (name, a.stride())
    assert ours.BLOCK_SIZE == theirs.BLOCK_SIZE and ours.seq_lengths == theirs.seq_lengths


def test_the_compiled_flex_kernel_equals_the_dense_mask():
    """The compiled FlexAttention forward, the one kernel on CPU that reads the block tables
    (it skips the tiles they leave out and drops the mask on the tiles they call full), equals
    the dense mask at every example position, with and without lanes. The eager form of the
    test above cannot see a table the kernel misreads."""
    compiled = torch.compile(flex.flex_attention, dynamic=False)
    rng = np.random.default_rng(1)
    B, T = 2, 1000
    for lanes in (False, True, False):
        (row, start, length), frame, branch = _random_layout(rng, B, T, lanes)
        dense = _dense_block_mask(B, T, row, start, length, frame, branch)
        keep = dense[:, 0].any(-1)[:, None, :, None]
        q, k, v = (torch.randn(B, 2, T, 16) for _ in range(3))
        ref = F.scaled_dot_product_attention(q, k, v, attn_mask=dense | ~keep)
        with torch.no_grad():
            flex_mask = Flex(Layout.packed(B, T, row, start, length, frame, branch)).block_mask()
            out = compiled(q, k, v, block_mask=flex_mask)
        torch.testing.assert_close(out * keep, ref * keep, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("learner", ["cot", "rm"])
def test_the_cuda_path_step_equals_the_cpu_path_step(examples_of, learner):
    """One optimizer step on real packed rows through the CUDA path (rows laid end to end into
    fixed-length micro-batches, FlexAttention) and through the CPU path (rows by length,
    blocks / dense masks): the same loss, gradient norm, gradients and updated weights."""
    data, rows = examples_of[learner]
    rows = rows[:6]  # CPU FlexAttention materialises every score: a few rows are enough
    tc = TrainConfig(micro_batch_tokens=2048)
    results = []
    for kind in ("blocks", "flex"):
        torch.manual_seed(0)
        model = Transformer(preset("tiny", learner, len(VOCAB)))
        opt = configure_optimizer(model, tc)
        grads = []  # what the two paths compute, read just before AdamW consumes (and frees) them
        opt.register_step_pre_hook(lambda o, a, k: grads.extend(p.grad.detach().clone() for p in model.parameters()))
        batches = step_batches(data, rows, VOCAB.pad_id, tc, CPU, kind, model.cfg.block_size)
        if kind == "flex":
            assert all(b.idx.shape == (1, 2048) for b in batches)  # one shape for every micro-batch
        with cpu_flex():
            loss, norm = optimizer_step(model, model, opt, batches, tc, CPU)
        results.append((float(loss), float(norm), grads, [p.detach().clone() for p in model.parameters()]))
    (la, na, ga, wa), (lb, nb, gb, wb) = results
    assert la == pytest.approx(lb, rel=1e-5) and na == pytest.approx(nb, rel=1e-4)
    assert len(ga) == len(wa) > 0
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, atol=1e-6 * na, rtol=1e-4)  # summation order only: ~1e-8 of the norm
    # AdamW's first step is lr * g / (|g| + eps): for a gradient within a few hundred eps of zero
    # that ratio turns float noise in g into a visible share of a step, so the weights are
    # compared where the step is set by the gradient's sign, not by eps, or where the two
    # gradients are equal bit for bit (unused position rows among them).
    clear = [(x.abs() > 1e3 * opt.param_groups[0]["eps"]) | (x == y) for x, y in zip(ga, gb)]
    assert sum(int(c.sum()) for c in clear) > 0.9 * sum(g.numel() for g in ga)
    for x, y, c in zip(wa, wb, clear):
        torch.testing.assert_close(x[c], y[c], atol=1e-6, rtol=1e-4)


def test_flat_micro_batches_keep_every_example_whole_and_in_order(examples_of):
    data, rows = examples_of["cot"]
    lengths = data.lengths - 1
    flat = flat_micro_batches(rows, lengths, 4096)
    assert [e for r in flat for e in r.examples] == [e for r in rows for e in r.examples]
    assert all(r.length == 4096 and lengths[list(r.examples)].sum() <= 4096 for r in flat)
    with pytest.raises(ValueError, match="does not fit"):
        flat_micro_batches(rows, lengths, 64)


def test_positions_are_checked_where_batches_are_built(examples_of):
    data, rows = examples_of["cot"]
    longest = max(rows, key=lambda r: r.length)
    with pytest.raises(ValueError, match="beyond the model's 16"):
        collate(data.ids, data.loss, data.offsets, [longest], VOCAB.pad_id, data.layout, block_size=16)


# --- no host waits, one graph, few kernels -----------------------------------------------


class CountKernels(TorchDispatchMode):
    """Operators that run a kernel (examples_of, allocations and device queries excluded), by name."""

    supports_higher_order_operators = True  # FlexAttention's forward and backward count one each
    FREE = {"prim.device", "aten.empty", "aten.empty_strided", "aten.new_empty", "aten.new_empty_strided",
            "aten.detach", "aten.lift_fresh"}

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name() if isinstance(func, torch._ops.HigherOrderOperator) else str(func.overloadpacket)
        if not (getattr(func, "is_view", False) or name in self.FREE):
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def fake_step(learner: str, kind: str, data, rows, tc: TrainConfig, count: bool = False) -> collections.Counter:
    """A full training step of the paper's model (forward, backward, clipping, the non-finite
    record, AdamW) under FakeTensorMode, batches built for real on the host as the trainer
    builds them; returns the kernels of a second step when `count`."""
    cfg = preset("paper", learner, len(VOCAB))
    batches = step_batches(data, rows, VOCAB.pad_id, tc, CPU, kind, cfg.block_size)
    counter = CountKernels()
    with cpu_flex(), mock.patch.object(flex, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", count), \
            FakeTensorMode(allow_non_fake_inputs=True):
        model = Transformer(cfg)
        opt = configure_optimizer(model, tc)
        guard = FiniteGuard(CPU)
        optimizer_step(model, model, opt, batches, tc, CPU, guard)
        with pytest.raises(DataDependentOutputException):
            bool(guard.found)  # a read of a device value does raise here
        if count:
            with counter:  # the steady state: AdamW's moments exist by now
                optimizer_step(model, model, opt, batches, tc, CPU, guard)
    return counter.ops


@pytest.mark.parametrize("kind", ["blocks", "flex"])
@pytest.mark.parametrize("learner", ["cot", "rm"])
def test_a_paper_training_step_never_waits_for_the_device(examples_of, learner, kind):
    data, rows = examples_of[learner]
    fake_step(learner, kind, data, rows, TrainConfig())


def test_a_paper_cot_step_launches_few_kernels_and_one_attention_call_per_layer(examples_of):
    """Budget: 300 kernels for a CoT step at paper size on the CUDA path with one micro-batch per
    step (eager count: a compiled model fuses further). The CPU path's per-example groups
    ran about 4,000 on the same rows."""
    data, rows = examples_of["cot"]
    ops = fake_step("cot", "flex", data, rows, TrainConfig(micro_batch_tokens=65536), count=True)
    assert ops["flex_attention"] == 6 and ops["flex_attention_backward"] == 6  # n_layer, one each
    assert sum(ops.values()) <= 300, ops.most_common(10)


def test_the_model_compiles_to_one_graph_without_recompiling(examples_of):
    """torch._dynamo traces the paper model's forward on the CUDA path's batches in one graph,
    and a second batch of the step (other examples, same shape) reuses it."""
    data, rows = examples_of["cot"]
    model = Transformer(preset("paper", "cot", len(VOCAB))).eval()
    tc = TrainConfig(micro_batch_tokens=512)
    small = [r for r in rows if r.length <= 512]
    batches = step_batches(data, small, VOCAB.pad_id, tc, CPU, "flex", 512)[:2]
    assert len(batches) == 2
    torch._dynamo.reset()
    with torch.no_grad():
        b = batches[0]
        explained = torch._dynamo.explain(model)(b.idx, pos=b.pos, attn=b.attn)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
        torch._dynamo.reset()
        counter = CompileCounter()
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        for b in batches:
            compiled(b.idx, pos=b.pos, attn=b.attn)
    torch._dynamo.reset()
    assert counter.frame_count == 1


def test_bf16_autocast_matches_fp32(examples_of):
    """The CUDA path computes in bf16 autocast: on CPU, bf16 autocast gives the fp32 loss within
    1% and gradients pointing the same way."""
    data, rows = examples_of["rm"]
    torch.manual_seed(0)
    model = Transformer(preset("small", "rm", len(VOCAB)))
    b = step_batches(data, rows, VOCAB.pad_id, TrainConfig(), CPU, "blocks", model.cfg.block_size)[0]
    grads = []
    for dtype in (None, torch.bfloat16):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16) if dtype else contextlib.nullcontext():
            loss, _ = batch_loss(model, b, CPU)
        (loss / b.n_targets).backward()
        grads.append((float(loss.detach()) / b.n_targets, torch.cat([p.grad.flatten() for p in model.parameters()])))
    (l32, g32), (l16, g16) = grads
    assert abs(l16 - l32) < 0.01 * l32
    assert F.cosine_similarity(g16, g32, dim=0) > 0.99


def test_attention_kind_follows_the_device_dropout_and_encoding():
    def cfg(dropout=0.0, positions="learned"):
        return ModelConfig(vocab_size=len(VOCAB), n_layer=1, n_head=2, n_embd=16, block_size=64, dropout=dropout,
                           positions=positions)

    assert attention_kind(torch.device("cuda"), cfg()) == "flex"
    assert attention_kind(torch.device("cuda"), cfg(dropout=0.1)) == "blocks"  # FlexAttention has no attention dropout
    assert attention_kind(torch.device("cuda"), cfg(positions="alibi")) == "blocks"  # nor ALiBi's bias
    assert attention_kind(torch.device("cuda"), cfg(positions="rope")) == "flex"
    assert attention_kind(CPU, cfg()) == "blocks"


# --- decoding -------------------------------------------------------------------------------


class Recording:
    """A predictor that keeps every step's logits of the one it wraps."""

    def __init__(self, inner):
        self.inner, self.block_size, self.logits = inner, inner.block_size, []

    def reset(self, n_slots: int) -> None:
        self.inner.reset(n_slots)

    def __call__(self, feeds):
        out = self.inner(feeds)
        self.logits.append(self.inner.logits.clone())
        return out


@pytest.mark.parametrize("learner", ["cot", "rm"])
def test_decoding_with_a_cache_allocated_once_equals_the_growing_cache(learner, monkeypatch):
    """The CUDA layout of the decoder on CPU: a cache allocated once for the whole block gives
    the tokens and logits of the cache that grows, and every step sends its token layout to
    the device in one copy."""
    from conftest import sample_expressions

    from rlmlab.decoding.driver import generate
    from rlmlab.decoding.engine import ModelPredictor, _Upload
    from rlmlab.decoding.oracle import oracle_predictor
    from rlmlab.decoding.predictor import TeacherForced

    torch.manual_seed(0)
    model = Transformer(preset("tiny", learner, len(VOCAB))).eval()
    exprs = sample_expressions(12, seed=3)
    sends = collections.Counter()
    real_send = _Upload.send

    def counted(self, device):
        sends["sends"] += 1
        return real_send(self, device)

    monkeypatch.setattr(_Upload, "send", counted)
    steps = []
    for capacity in (None, model.cfg.block_size):
        predictor = ModelPredictor(model, capacity=capacity)
        recording = Recording(predictor)
        gens = generate(TeacherForced(recording, oracle_predictor(learner, VOCAB, library=PAPER.library)), exprs, VOCAB, learner, batch_size=4, library=PAPER.library)
        steps.append(([g.tokens for g in gens], recording.logits))
        if capacity is not None:
            assert predictor.cache.capacity == model.cfg.block_size and not predictor.cache.grow
    (tok_a, log_a), (tok_b, log_b) = steps
    assert tok_a == tok_b and len(log_a) == len(log_b) > 0
    for a, b in zip(log_a, log_b):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert sends["sends"] == 2 * len(log_a)  # one copy per decoding step


# --- Ray ------------------------------------------------------------------------------------


class FakeCluster:
    """What `ray.nodes()` says of a cluster: nodes with their CPUs and GPUs."""

    def __init__(self, *nodes: dict):
        self._nodes = [{"Alive": True, "Resources": r} for r in nodes]

    def nodes(self):
        return self._nodes


def test_ray_jobs_reserve_a_share_of_a_gpu_where_the_cluster_has_one():
    from rlmlab.errors import ConfigError
    from rlmlab.experiments.cluster import GPU_SHARE, _gpu_share, _gpus, _refuse_unschedulable
    from rlmlab.experiments.job import Job
    from rlmlab.experiments.presets import config_from_settings

    def job(**settings):
        return Job("j", "rm", config_from_settings({"train.threads": 1, **settings}, "rm", "t.parquet", "v.parquet"), {})

    gpu_node, cpu_node = FakeCluster({"CPU": 16, "GPU": 1}), FakeCluster({"CPU": 16})
    assert _gpu_share(gpu_node, None) == GPU_SHARE == 0.25 and _gpu_share(cpu_node, None) == 0.0
    assert _gpu_share(gpu_node, 0.5) == 0.5 and _gpu_share(gpu_node, 0.0) == 0.0
    assert _gpus(job(), 0.25) == 0.25 and _gpus(job(**{"train.device": "cuda"}), 0.25) == 0.25
    assert _gpus(job(**{"train.device": "cpu"}), 0.25) == 0.0  # a CPU job takes no GPU
    _refuse_unschedulable(gpu_node, [job()], 0.25)
    _refuse_unschedulable(cpu_node, [job(**{"train.device": "cpu"})], 0.25)
    with pytest.raises(ConfigError, match="no node of the Ray cluster has a GPU"):
        _refuse_unschedulable(cpu_node, [job()], 0.25)


def test_ray_gpu_share_is_checked_before_anything_is_written(tmp_path, capsys):
    from rlmlab.cli import main

    out = tmp_path / "x"
    base = ["run", "length", "--preset", "smoke", "--out", str(out), "--quiet"]
    assert main(base + ["--ray-gpus-per-job", "0.5"]) == 2
    assert "goes with --ray-address" in capsys.readouterr().err
    assert main(base + ["--ray-address", "127.0.0.1:1", "--ray-gpus-per-job", "2"]) == 2
    assert "must lie in [0, 1], got 2" in capsys.readouterr().err
    assert not out.exists()


# --- the trainer on the CUDA path -----------------------------------------------------------


@pytest.mark.parametrize("learner", ["cot", "rm"])
def test_the_trainer_on_the_cuda_path_logs_what_the_cpu_path_logs(learner, tmp_path, monkeypatch):
    """`train` with the CUDA path's attention (fixed-length rows, FlexAttention, validation
    included) logs the losses and validation metrics of the CPU path, within float noise."""
    import rlmlab.learning.train as training
    from rlmlab.learning.config import ModelSettings, RunConfig

    exprs = build_pool(40, 7, workers=1, task=PAPER).column("expr").to_pylist()
    tr, va = (build_examples(e, learner, VOCAB, workers=1, task=PAPER) for e in (exprs[:30], exprs[30:]))
    cfg = RunConfig(ModelSettings(preset="tiny"), DataSettings(learner=learner, cache_dir=""),
                    TrainConfig(max_steps=3, warmup_steps=1, eval_every=3, log_every=1, batch_size=4, seed=1,
                                micro_batch_tokens=1024))
    logs = {}
    for kind in ("blocks", "flex"):
        monkeypatch.setattr(training, "attention_kind", lambda device, cfg, kind=kind: kind)
        with cpu_flex():
            training.train(cfg, tr, va, tmp_path / kind, task=PAPER, progress=False, echo=lambda s: None)
        logs[kind] = read_metrics(tmp_path / kind)
    a, b = ([(r["kind"], r.get("loss"), r.get("token_acc")) for r in logs[k] if r["kind"] in ("train", "val")]
            for k in ("blocks", "flex"))
    assert [x[0] for x in a] == [x[0] for x in b] == ["train"] * 3 + ["val"]
    for (_, la, ta), (_, lb, tb) in zip(a, b):
        assert la == pytest.approx(lb, rel=1e-4) and ta == tb


def test_a_non_finite_step_between_log_points_never_reaches_a_checkpoint(tmp_path, monkeypatch):
    """Losses are read only every log_every steps; a step that goes non-finite in between is
    skipped on the device and caught before the next validation or save: the run stops
    naming it, `last` stays at the save before it, and no validation runs after it."""
    import itertools

    import rlmlab.learning.step as stepping
    import rlmlab.learning.train as training
    from rlmlab.errors import TrainingDiverged
    from rlmlab.learning.checkpoint import load_run
    from rlmlab.learning.config import ModelSettings, RunConfig

    exprs = build_pool(60, 7, workers=1, task=PAPER).column("expr").to_pylist()
    tr, va = (build_examples(e, "rm", VOCAB, workers=1, task=PAPER) for e in (exprs[:50], exprs[50:]))
    cfg = RunConfig(ModelSettings(preset="tiny"), DataSettings(learner="rm", cache_dir=""),
                    TrainConfig(max_steps=12, warmup_steps=1, eval_every=4, log_every=100, batch_size=8, seed=1))
    calls, poison = itertools.count(1), {"on": False}
    real_step, real_loss = training.train_step, stepping.batch_loss

    def step(*args, **kwargs):
        poison["on"] = next(calls) >= 7  # steps 7 on
        try:
            return real_step(*args, **kwargs)
        finally:
            poison["on"] = False

    def loss(fwd, batch, device):
        value, logits = real_loss(fwd, batch, device)
        return (value * float("nan") if poison["on"] else value), logits

    monkeypatch.setattr(training, "train_step", step)
    monkeypatch.setattr(stepping, "batch_loss", loss)
    with pytest.raises(TrainingDiverged, match="at step 7"):
        training.train(cfg, tr, va, tmp_path, task=PAPER, progress=False, echo=lambda s: None)
    records = read_metrics(tmp_path)
    assert [r["step"] for r in records if r["kind"] == "val"] == [4]  # none at step 8
    assert [r["step"] for r in records if r["kind"] == "diverged"] == [6]  # the last good step
    last = load_run(tmp_path, "last")
    assert last.step == 4 and all(torch.isfinite(p).all() for p in last.model.parameters())


def test_flex_attention_outside_a_compiled_model_compiles_once_per_mask_rule():
    """Without train.compile, CUDA runs FlexAttention through a compiled kernel of its own; each
    batch brings a new `mask_mod` closure, which must not recompile it (one graph for the
    plain rule, one for the lane rule)."""
    from torch.nn.attention.flex_attention import flex_attention

    counter = CompileCounter()
    compiled = torch.compile(flex_attention, backend=counter, dynamic=False)
    T = 256
    torch._dynamo.reset()
    with torch.no_grad():
        for n in (17, 100, 201):
            layout = (torch.tensor([0, 0]), torch.tensor([0, n]), torch.tensor([n, T - n]))
            q = torch.randn(1, 2, T, 16)
            compiled(q, q, q, block_mask=Flex(Layout.packed(1, T, *layout)).block_mask())
            lanes = (torch.zeros(1, T, dtype=torch.long), torch.full((1, T), -1))
            compiled(q, q, q, block_mask=Flex(Layout.packed(1, T, *layout, *lanes)).block_mask())
    torch._dynamo.reset()
    assert counter.frame_count == 2
