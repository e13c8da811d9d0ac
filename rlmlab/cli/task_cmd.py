"""`rlmlab task [NAME|FILE]`: check a task file and describe the task (or print it canonically)."""

from __future__ import annotations

from collections import Counter

from rlmlab.task.taskfile import builtin_tasks, load_task


def register(sub) -> None:
    p = sub.add_parser("task", help="check a task file and describe the task",
                       description="Read a task (a task file, docs/tasks.md, or a built-in name), check that it "
                                   "is well posed, and print its functions, generator and identity.")
    p.add_argument("task", nargs="?", default=None, metavar="NAME|FILE",
                   help=f"a task file or a built-in name ({', '.join(builtin_tasks())}); default paper")
    p.add_argument("--toml", action="store_true", help="print the task as a task file in canonical form")
    p.set_defaults(handler=run)


def run(args) -> int:
    task = load_task(args.task)
    if args.toml:
        print(task.to_toml(), end="")
        return 0
    lib, g = task.library, task.generator
    kinds = Counter(f.kind for f in lib)
    print(f"task {task.name!r} ({'built in' if task.source in builtin_tasks() + ['built-in'] else task.source})")
    if task.description:
        print(f"  {task.description}")
    print(f"  digest      {task.digest}")
    print(f"  modulus     {task.modulus} (digits 0..{task.modulus - 1})")
    print(f"  functions   {len(lib)}: {kinds['primitive']} primitive, {kinds['composite']} composite, "
          f"{kinds['recursive']} tail-recursive")
    for f in lib:
        args_ = ", ".join(f"{p}: {t}" + (" (lazy)" if p in f.lazy else "")
                          for p, t in zip(f.params + f.lazy, f.arg_types))
        what = f.rule if f.kind == "primitive" else f.body
        print(f"    {f.kind:<9}  {f.name}({args_}) -> {f.return_type} = {what}")
    roots = "uniform" if task.root_weights is None else ", ".join(
        f"{f.name} {w:g}" for f, w in zip(lib, task.root_weights) if w)
    print(f"  generator   p_lit {g.p_lit}, nesting bound {g.max_level}, roots {roots}")
    print(f"  vocabulary  {len(task.vocab)} tokens")
    return 0
