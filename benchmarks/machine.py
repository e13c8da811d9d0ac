"""Machine facts every benchmark prints next to its figures."""

from __future__ import annotations

from rlmlab.machine import machine_facts


def print_facts() -> None:
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine_facts().items()))
