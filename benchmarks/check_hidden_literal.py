"""Hidden intermediate literal: where S = k sits in the trace, what RM's root frames show of it,
and how far every construction's S is from the answer (issue 66, item 3).

    python benchmarks/check_hidden_literal.py results/shortcuts-paper-cpu [--n-train 1000] [--examples 2]

Reads a shortcut experiment folder (`rlmlab run shortcuts` or its export): the IID and OOD
expressions each learner was scored on (`shortcut-<name>/<learner>/eval/{iid,ood}`, the very
sets of `data/shortcut-<name>/`), and `data/shortcut-hidden_literal/shortcut.json` for the
seed and sampler configuration, from which it regenerates the first `--n-train` training
expressions exactly as `build_shortcut_dataset` draws them (the training set is drawn from its
own RNG and excludes nothing, so its first N rows do not depend on its size; the whole
10,000 take about 18 minutes of an idle core, far more on a loaded one). Nothing is trained
or decoded. It prints, for hidden_literal:

1. where k sits in the flattened trace (the W return that binds it, its later occurrences
   inside the helper, by role) relative to the answer token and to the trace length, and every
   occurrence of the digit k in the trace by region and role; one or two traces with k marked;
2. every RM root frame (`observer("rm").examples`, depth 1): in how many the digit k is
   visible before the answer, and in which role (the helper's own argument or return never
   reaches the root; a digit of the written expression can equal k by coincidence);
3. S == answer on every training and IID expression, S != answer on every OOD one;
4. what separates the construction from the paper's text, with the figures that bear on it
   (distance of S from the answer in all six constructions beside CoT's shortcut rate, the
   compensating literal's range, what the selector passes on);
5. what the folder holds of CoT's reading there: its probe summary and, from the evaluation
   records, teacher-forced errors on the canonical traces (no checkpoint is needed).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import print_facts  # noqa: E402

from rlmlab.learning.observe import observer, reference_examples  # noqa: E402
from rlmlab.measuring.result_files import read_results  # noqa: E402
from rlmlab.shortcuts import (  # noqa: E402
    CONSTRUCTIONS,
    ShortcutConfig,
    child,
    frame_tree,
    get_construction,
    internal_returns,
    root_payload,
)
from rlmlab.shortcuts.dataset import _draw_set  # noqa: E402
from rlmlab.shortcuts.root_frame import literal_paths  # noqa: E402
from rlmlab.task.expr import DIGITS  # noqa: E402
from rlmlab.task.sampler import GeneratorConfig  # noqa: E402
from rlmlab.task.taskfile import load_task
from rlmlab.task.vocab import ASSIGN, CALL, END_CALL, END_RETURN, RETURN  # noqa: E402

PAPER = load_task("paper")

NAME = "hidden_literal"
H_PATH = (0, 0, 0)  # root add -> max -> multiply -> H
V_PATH = (0, 1)  # root add -> max -> V


# --- reading one trace --------------------------------------------------------------------

def role(tokens, i, in_call: bool) -> str:
    """What a digit token at index i of the emitted trace is."""
    if in_call:
        return "call text"
    if tokens[i - 1] == RETURN and tokens[i + 1] == END_RETURN:
        return "return value"
    if tokens[i - 1] == ASSIGN:
        return "bound literal"
    return "other"


def call_text_mask(tokens, start: int) -> list[bool]:
    """For every index, whether it lies between a <call> and its </call> (the written call)."""
    mask, inside = [False] * len(tokens), False
    for i in range(start, len(tokens)):
        if tokens[i] == CALL:
            inside = True
        elif tokens[i] == END_CALL:
            inside = False
        elif inside:
            mask[i] = True
    return mask


def literal_owner(path: tuple[int, ...]) -> str:
    """Which part of add(max(multiply(H, 0), V), Y) a literal leaf of the written expression is in."""
    if path[:3] == H_PATH:
        rest = path[3:]
        return {0: "H's counter", 1: "W"}.get(rest[0], "H's other argument") if rest else "H"
    if path == (0, 0, 1):
        return "multiply's 0"
    if path[:2] == V_PATH:
        return "V"
    if path == (1,):
        return "Y"
    return "other"


def literal_positions(tokens, prompt_len: int) -> list[int]:
    """Indices of the literal leaves of a written expression, in `literal_paths` order."""
    return [i for i in range(prompt_len) if tokens[i] not in ("(", ")", ",")
            and not (i + 1 < prompt_len and tokens[i + 1] == "(")]


def analyse(text: str) -> dict:
    """Everything the checks need from one hidden_literal expression."""
    expr = PAPER.parse(text)
    ex = PAPER.execute(expr)
    toks, p = ex.tokens, ex.prompt_len
    tree = frame_tree(toks, p)
    helper = child(tree, *H_PATH)
    vframe = child(tree, *V_PATH)
    counter_is_call = not isinstance(expr.args[0].args[0].args[0].args[0], str)
    wframe = helper.children[1 if counter_is_call else 0]
    k = wframe.value
    signal = get_construction(NAME).signal(toks, p)
    assert signal == k, (text, signal, k)
    answer_pos = len(toks) - 2
    bind_pos = internal_returns(toks, wframe)[-1][0]  # W's value token: where k is computed
    assert toks[bind_pos] == k
    mask = call_text_mask(toks, p)
    paths = literal_paths(expr)
    lit_pos = literal_positions(toks, p)
    assert [toks[i] for i in lit_pos] == [t for _, t in paths], text
    owner_at = {i: literal_owner(path) for i, (path, _) in zip(lit_pos, paths)}

    # every occurrence of the digit k before the answer, by region and role
    occ = []
    for i, t in enumerate(toks[:answer_pos]):
        if t != k:
            continue
        if i < p:
            region = "written expression"
        elif i == bind_pos:
            region = "W's value (binds k)"
        elif wframe.start <= i < wframe.end:
            region = "inside W"
        elif wframe.end <= i < helper.end:
            region = "helper after W"
        elif helper.start <= i < helper.end:
            region = "helper before W"
        elif vframe.start <= i < vframe.end:
            region = "V"
        else:
            region = "selector / root frames"
        occ.append((i, region, ("literal of " + owner_at[i]) if i < p else role(toks, i, mask[i])))
    helper_k = [i for i, region, _ in occ if region == "helper after W"]
    last_helper_k = max(helper_k, default=bind_pos)
    # the helper's own recursion: calls of its function inside its body (its last child)
    body = helper.children[-1]
    recursions, stack = 0, [body]
    while stack:
        f = stack.pop()
        recursions += f.call[0] == helper.call[0]
        stack.extend(f.children)
    v = child(tree, 0).value
    y = expr.args[1]

    # RM: every root frame (depth 1) and what of k it shows before the answer it must predict
    rm_examples = observer("rm").examples(toks, p)
    assert rm_examples == [(f.tokens, f.m) for f in ex.frames]
    root_roles: set = set()
    root_frames = [f for f in ex.frames if f.depth == 1]
    frames_with_k = 0
    for f in root_frames:
        ft = f.tokens
        visible = ft[:-2] if f is root_frames[-1] else ft  # the answer and </return> are targets
        fmask = call_text_mask(ft, p)
        frames_with_k += k in visible
        for i, t in enumerate(visible):
            if t != k:
                continue
            if i < p:
                root_roles.add("written expression, literal of " + owner_at[i])
            else:
                r = role(ft, i, fmask[i])
                if r == "call text":
                    r = "call text (repeats the written max(...))"
                elif r == "bound literal":
                    r = f"payload {ft[i - 2]} := {t}"
                root_roles.add(r)
    # every RM frame at every depth: where k is bound to a parameter (p := k)
    bound_k_by_depth: Counter = Counter()
    for f in ex.frames:
        ft = f.tokens
        if any(ft[i] == k and ft[i - 1] == ASSIGN for i in range(1, len(ft))):
            bound_k_by_depth[f.depth] += 1
    payload, _ = root_payload(ex.frames, p)
    # the max frame (depth 2) binds x := 0 (what multiply(H, 0) returns) and y := v
    max_binds_k = any(f.depth == 2 and any(f.tokens[i] == k and f.tokens[i - 1] == ASSIGN
                                           for i in range(1, len(f.tokens))) for f in ex.frames)
    return {
        "text": text, "tokens": toks, "prompt_len": p, "k": k, "signal": signal, "answer": ex.value_token,
        "v": v, "y": y, "h": helper.value, "payload": payload, "trace_len": len(toks), "answer_pos": answer_pos,
        "bind_pos": bind_pos, "last_helper_k": last_helper_k, "v_tokens": vframe.end - vframe.start,
        "occ": occ, "recursions": recursions, "root_roles": root_roles, "root_frames": len(root_frames),
        "root_frames_with_k": frames_with_k, "bound_k_by_depth": bound_k_by_depth, "helper_fn": helper.call[0],
        "helper_close": helper.end - 1, "max_binds_k": max_binds_k,
    }


def swapped_distances(text: str) -> tuple[int, int, int]:
    """What-if, not a construction of the code: the same H, V and Y written as
    add(max(V, multiply(H, 0)), Y), so that the helper runs after V (max is symmetric: the
    root still binds x := v). Tokens from k's binding, from k's last occurrence in the helper and
    from the helper's closing </return> to the answer."""
    expr = PAPER.parse(text)
    mx = expr.args[0]
    swapped = type(expr)(expr.fn, (type(mx)(mx.fn, (mx.args[1], mx.args[0])), expr.args[1]))
    ex = PAPER.execute(swapped)
    toks, p = ex.tokens, ex.prompt_len
    tree = frame_tree(toks, p)
    helper = child(tree, 0, 1, 0)
    counter_is_call = not isinstance(swapped.args[0].args[1].args[0].args[0], str)
    wframe = helper.children[1 if counter_is_call else 0]
    k = wframe.value
    bind = internal_returns(toks, wframe)[-1][0]
    last = max([i for i in range(wframe.end, helper.end) if toks[i] == k], default=bind)
    ans = len(toks) - 2
    return ans - bind, ans - last, ans - (helper.end - 1)



# --- S sources of every construction --------------------------------------------------------

def s_sources(name: str, text: str) -> tuple[list[int], int, int] | None:
    """(trace positions S is read from, answer position, trace length); None for a global S."""
    ex = PAPER.execute(PAPER.parse(text))
    toks, p = ex.tokens, ex.prompt_len
    tree = frame_tree(toks, p)
    if name == "copy_deep_return":
        pos = [internal_returns(toks, child(tree, 0, 0, 0))[-1][0]]
    elif name == NAME:
        a = analyse(text)
        pos = [a["bind_pos"], a["last_helper_k"]]
    elif name in ("long_range_aggregate", "near_answer_aggregate", "position_weighted_aggregate"):
        rets = internal_returns(toks, child(tree, 0))
        if name == "long_range_aggregate":
            pos = [t for t, _ in rets[:3]]
        elif name == "near_answer_aggregate":
            pos = [t for t, _ in rets[-3:]]
        else:
            pos = [t for t, v in rets if v == 0]
    else:
        return None
    return pos, len(toks) - 2, len(toks)


# --- printing -------------------------------------------------------------------------------

def pct(a: int, b: int) -> str:
    return f"{a}/{b} ({100 * a / b:.1f}%)" if b else "0/0"


def quart(xs) -> str:
    xs = sorted(xs)
    if not xs:
        return "-"
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return f"min {xs[0]:g}, q1 {q[0]:g}, median {q[1]:g}, q3 {q[2]:g}, max {xs[-1]:g}"


def marked(a: dict) -> str:
    """The trace with k marked: [[k]] where the helper binds or carries it, (k) a coincidental
    digit k, <<a>> the answer."""
    out = []
    kinds = {i: region for i, region, _ in a["occ"]}
    for i, t in enumerate(a["tokens"]):
        if i == a["answer_pos"]:
            out.append(f"<<{t}>>")
        elif i in kinds:
            out.append(f"[[{t}]]" if kinds[i] in ("W's value (binds k)", "helper after W") else f"({t})")
        else:
            out.append(t)
        if i == a["prompt_len"] - 1:
            out.append("\n   ")
    return " ".join(out)


def load_sets(folder: Path, name: str, learner: str) -> dict[str, list[dict]]:
    out = {}
    for part in ("iid", "ood"):
        d = folder / f"shortcut-{name}" / learner / "eval" / part
        if (d / "results.parquet").exists() or (d / "results.jsonl").exists():
            out[part] = read_results(d, traces=False)
    return out


def regenerate_train(folder: Path, n: int) -> list[dict]:
    meta = json.loads((folder / "data" / f"shortcut-{NAME}" / "shortcut.json").read_text())
    params = meta["params"]
    cfg = dict(params["config"])
    cfg["generator"] = GeneratorConfig(**cfg["generator"])
    config = ShortcutConfig(**cfg)
    seed = params["seed"]
    rng = random.Random(f"rlmlab-shortcut:{NAME}:train:{seed}")
    rows, _ = _draw_set(get_construction(NAME), "train", n, rng, config, set())
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", default="results/shortcuts-paper-cpu")
    ap.add_argument("--n-train", type=int, default=1000,
                    help="first N training expressions to regenerate (0: none; the set has 10,000)")
    ap.add_argument("--examples", type=int, default=2, help="traces to print with k marked")
    args = ap.parse_args()
    folder = Path(args.folder)
    print_facts()
    print(f"folder: {folder}")
    params = json.loads((folder / "data" / f"shortcut-{NAME}" / "shortcut.json").read_text())["params"]
    print(f"hidden_literal data: seed {params['seed']}, n_train {params['n_train']}, n_iid {params['n_iid']}, "
          f"n_ood {params['n_ood']}, config {json.dumps(params['config'])}")

    cot = load_sets(folder, NAME, "cot")
    rm = load_sets(folder, NAME, "rm")
    sets: dict[str, list[dict]] = {}
    for part in ("iid", "ood"):
        rows = cot.get(part) or rm.get(part)
        if rows is None:
            raise SystemExit(f"{folder}: no evaluation records of shortcut-{NAME} ({part})")
        sets[part] = [{"expr": r["expr"], "value": r["value"], "signal": r["signal"]} for r in rows]
        if cot.get(part) and rm.get(part):
            assert [r["expr"] for r in cot[part]] == [r["expr"] for r in rm[part]], "RM and CoT sets differ"
    if args.n_train:
        t0 = time.perf_counter()
        sets["train"] = regenerate_train(folder, args.n_train)
        print(f"regenerated the first {len(sets['train'])} of {params['n_train']} training expressions "
              f"in {time.perf_counter() - t0:.0f} s")
    order = [s for s in ("train", "iid", "ood") if s in sets]

    t0 = time.perf_counter()
    analysed = {s: [analyse(r["expr"]) for r in sets[s]] for s in order}
    print(f"executed and analysed {sum(len(v) for v in analysed.values())} expressions "
          f"in {time.perf_counter() - t0:.0f} s")
    # the reference observation agrees with the one-pass examples on a few traces
    for a in analysed["iid"][:3]:
        obs = observer("rm")
        assert reference_examples(obs, a["tokens"], a["prompt_len"]) == obs.examples(a["tokens"], a["prompt_len"])

    # 3 (first: it says the sets are what they claim) -------------------------------------
    print("\n== 3. S against the answer (S recomputed from the trace; stored signal and value checked)")
    for s in order:
        rows, an = sets[s], analysed[s]
        stored = sum(r["signal"] == a["signal"] and r["value"] == a["answer"] for r, a in zip(rows, an))
        agree = sum(a["signal"] == a["answer"] for a in an)
        print(f"  {s:5}: stored S and answer reproduced on {pct(stored, len(an))}; "
              f"S == answer on {pct(agree, len(an))}, S != answer on {pct(len(an) - agree, len(an))}")

    # 1 -----------------------------------------------------------------------------------
    print("\n== 1. Where S = k sits in the flattened trace (positions are token indices; answer = len - 2)")
    for s in order:
        an = analysed[s]
        print(f"  [{s}] {len(an)} expressions; trace length: {quart([a['trace_len'] for a in an])}")
        print(f"    tokens from k's binding (W's return) to the answer:      "
              f"{quart([a['answer_pos'] - a['bind_pos'] for a in an])}")
        print(f"    tokens from k's last occurrence in the helper to answer: "
              f"{quart([a['answer_pos'] - a['last_helper_k'] for a in an])}")
        print(f"    k's binding as a share of the trace (position / length): "
              f"{quart([round(a['bind_pos'] / a['trace_len'], 2) for a in an])}")
        print(f"    k's last helper occurrence as a share of the trace:       "
              f"{quart([round(a['last_helper_k'] / a['trace_len'], 2) for a in an])}")
        print(f"    tokens from the helper's closing </return> to the answer: "
              f"{quart([a['answer_pos'] - a['helper_close'] for a in an])}")
        print(f"    V's frame between the helper and the answer (tokens):    "
              f"{quart([a['v_tokens'] for a in an])}")
        nearest = []
        for a in an:
            emitted = [i for i, region, _ in a["occ"] if i >= a["prompt_len"]]
            nearest.append(a["answer_pos"] - max(emitted))
        print(f"    tokens from the nearest digit k of any role to answer:  {quart(nearest)}")
        counts = [len(a["occ"]) for a in an]
        print(f"    digit k before the answer, per trace: {quart(counts)}")
        by: Counter = Counter()
        for a in an:
            for _, region, r in a["occ"]:
                by[(region, r)] += 1
        n = len(an)
        for (region, r), c in sorted(by.items(), key=lambda kv: -kv[1]):
            print(f"      {region:24} {r:16} {c:6}  ({c / n:.2f} per trace)")
        hk = sum(a["h"] == a["k"] for a in an)
        rec = Counter(min(a["recursions"], 3) for a in an)
        print(f"    helper's returned value h equals k: {pct(hk, n)} (then k is also the helper's return "
              f"and the multiply frame's x)")
        print(f"    helper's own recursive calls (0 = base case at once; 3 means 3+): "
              + ", ".join(f"{r}: {c}" for r, c in sorted(rec.items())))
        print("    helper function: " + ", ".join(f"{f} {c}" for f, c in Counter(a["helper_fn"] for a in an).most_common()))

    shown = 0
    for s, want in (("iid", None), ("ood", "shortcut")):
        if shown >= args.examples:
            break
        an = analysed[s]
        pick = an[0]
        if want == "shortcut" and cot.get("ood"):
            follow = [a for a, r in zip(an, cot["ood"]) if r.get("prediction") == a["signal"]]
            pick = follow[0] if follow else an[0]
        print(f"\n  example ({s}{', CoT answered S here' if pick is not an[0] else ''}): {pick['text']}")
        print(f"    k = {pick['k']}, v = {pick['v']}, Y = {pick['y']}, answer = {pick['answer']}, "
              f"helper value h = {pick['h']}, trace {pick['trace_len']} tokens, answer at {pick['answer_pos']}, "
              f"k bound at {pick['bind_pos']}, last in the helper at {pick['last_helper_k']}")
        print("    [[k]] = k bound or carried by the helper, (k) = the digit k elsewhere, <<a>> = the answer")
        print("    " + marked(pick))
        shown += 1

    # 2 -----------------------------------------------------------------------------------
    print("\n== 2. RM's root frames (every active frame at depth 1, up to the answer token it must predict)")
    for s in order:
        an = analysed[s]
        frames = sum(a["root_frames"] for a in an)
        showing = sum(a["root_frames_with_k"] for a in an)
        expr_with = sum(a["root_frames_with_k"] > 0 for a in an)
        roles: Counter = Counter()
        for a in an:
            roles.update(a["root_roles"])
        payload_k = sum(a["k"] in a["payload"] for a in an)
        print(f"  [{s}] root frames: {frames} in {len(an)} expressions; showing the digit k: "
              f"{pct(showing, frames)} of frames, {pct(expr_with, len(an))} of expressions")
        print(f"    k in the root payload (x := v, y := Y): {pct(payload_k, len(an))}; "
              f"v == k: {sum(a['v'] == a['k'] for a in an)}, Y == k: {sum(a['y'] == a['k'] for a in an)}")
        for r, c in sorted(roles.items(), key=lambda kv: -kv[1]):
            print(f"      {r:56} in {pct(c, len(an))} expressions")
        depth: Counter = Counter()
        for a in an:
            depth.update(a["bound_k_by_depth"])
        mk = [a for a in an if a["max_binds_k"]]
        print(f"    max frames (depth 2) binding k: in {len(mk)} expressions, "
              f"all with k = 0 (the constant x := 0 that multiply(H, 0) passes on): {all(a['k'] == '0' for a in mk)}")
        print("    RM frames where k is bound to a parameter (p := k), by depth: "
              + ", ".join(f"d{d}: {c}" for d, c in sorted(depth.items())))

    # 4 -----------------------------------------------------------------------------------
    print("\n== 4. Construction facts that bear on the comparison with the paper")
    for s in order:
        an = analysed[s]
        ys = Counter(a["y"] for a in an)
        vs = Counter(a["v"] for a in an)
        ks = Counter(a["k"] for a in an)
        pairs = len({(a["v"], a["y"]) for a in an})
        print(f"  [{s}] Y (compensating literal): " + " ".join(f"{d}:{ys.get(d, 0)}" for d in DIGITS)
              + f"   v: " + " ".join(f"{d}:{vs.get(d, 0)}" for d in DIGITS)
              + f"   k: " + " ".join(f"{d}:{ks.get(d, 0)}" for d in DIGITS)
              + f"   distinct root payloads (v, Y): {pairs}")
    for s in order:
        d = [swapped_distances(a["text"]) for a in analysed[s]]
        print(f"  [{s}] what-if H after V, add(max(V, multiply(H, 0)), Y): tokens to the answer from k's binding "
              f"{quart([x[0] for x in d])}; from k's last helper occurrence {quart([x[1] for x in d])}; "
              f"from the helper's </return> {quart([x[2] for x in d])}")
    if cot.get("ood"):
        y0 = [(a, r) for a, r in zip(analysed["ood"], cot["ood"]) if a["y"] == "0"]
        print(f"  OOD with Y = 0 (never in training, where Y = k - v != 0): {len(y0)}; CoT correct on "
              f"{sum(r['correct'] for _, r in y0)}, answers S on {sum(r.get('prediction') == a['signal'] for a, r in y0)}")

    print("\n  S against the answer, every construction (the folder's IID + OOD expressions; "
          "CoT's OOD shortcut rate and IID accuracy from its evaluation records).\n"
          "  S far / near: tokens before the answer of the farthest / nearest trace position S is read from\n"
          "  (hidden_literal: k's binding / k's last occurrence in the helper); payloads: distinct root payloads, IID")
    print(f"  {'construction':28} {'n':>4} {'S far: tokens to answer':>28} {'S near: tokens to answer':>28} "
          f"{'near/len':>9} {'payloads':>9} {'CoT IID':>8} {'CoT follows S':>14}")
    for name in CONSTRUCTIONS:
        c_sets = load_sets(folder, name, "cot") or load_sets(folder, name, "rm")
        if not c_sets:
            continue
        far, near, rel = [], [], []
        payloads = set()
        n = 0
        for part in ("iid", "ood"):
            for r in c_sets.get(part, []):
                got = s_sources(name, r["expr"])
                n += 1
                if part == "iid":
                    ex = PAPER.execute(PAPER.parse(r["expr"]))
                    payloads.add(root_payload(ex.frames, ex.prompt_len)[0])
                if got is None or not got[0]:
                    continue
                pos, ans, length = got
                far.append(ans - min(pos))
                near.append(ans - max(pos))
                rel.append(max(pos) / length)
        cot_c = load_sets(folder, name, "cot")
        iid_acc = (f"{100 * sum(r['correct'] for r in cot_c['iid']) / len(cot_c['iid']):.1f}%"
                   if cot_c.get("iid") else "-")
        rate = (f"{100 * sum(r.get('prediction') == r['signal'] for r in cot_c['ood']) / len(cot_c['ood']):.1f}%"
                if cot_c.get("ood") else "-")
        med = (lambda xs: f"median {statistics.median(xs):g} (q1-q3 "
               f"{statistics.quantiles(xs, n=4)[0]:g}-{statistics.quantiles(xs, n=4)[2]:g})" if xs else "global")
        print(f"  {name:28} {n:>4} {med(far):>28} {med(near):>28} "
              f"{(f'{statistics.median(rel):.2f}' if rel else '-'):>9} {len(payloads):>9} {iid_acc:>8} {rate:>14}")

    # 5 -----------------------------------------------------------------------------------
    print("\n== 5. What the folder holds of CoT's reading on hidden_literal")
    for learner in ("cot", "rm"):
        for part in ("iid", "ood"):
            f = folder / f"shortcut-{NAME}" / learner / "probe" / part / "summary.json"
            if f.exists():
                g = json.loads(f.read_text())["groups"][0]
                print(f"  probe {learner} {part}: non-invariant prediction points "
                      f"{pct(g['position_non_invariant'], g['positions'])}")
    for part in ("iid", "ood"):
        rows = cot.get(part)
        if not rows:
            continue
        tf_all = sum(r.get("tf_correct") == r.get("tf_total") for r in rows)
        wrong = [r for r in rows if not r["correct"]]
        print(f"  CoT {part}: teacher-forced on the canonical trace, every token right on {pct(tf_all, len(rows))}; "
              f"free-running wrong {len(wrong)}: " + "; ".join(
                  f"S={r['signal']} answer={r['value']} predicted={r['prediction']} "
                  f"diverged at {r['diverge_at']} of {r['trace_len']}" for r in wrong))
    ckpts = list((folder / f"shortcut-{NAME}" / "cot").glob("*/model.safetensors"))
    print(f"  CoT checkpoint in the folder: {ckpts[0].parent if ckpts else 'none (checkpoints are not exported)'}")


if __name__ == "__main__":
    main()
