"""What a run or a benchmark ran on: CPU model, cores, Python and torch versions, threads, GPU.

Training logs it at the start of each session (metrics.jsonl), so that two runs of the same
command that part in their last digits can be told apart by the processor they ran on. A
virtual machine's model name can be as vague as "AMD EPYC", so the processor's family, model,
stepping and cache size, and the instruction set torch's kernels dispatch to, are logged too."""

from __future__ import annotations

import os
import platform

import torch

SAME_BITS = ("cpu", "cpu_id", "isa", "torch")
"""The facts two machines must share for a float32 CPU computation to agree bit for bit on both."""


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def machine_facts() -> dict:
    info = _cpuinfo()
    cpu = info.get("model name") or platform.processor() or platform.machine()
    cpu_id = " ".join(f"{k.split()[-1]} {info[k]}" for k in ("cpu family", "model", "stepping") if k in info)
    if "cache size" in info:
        cpu_id += f", cache {info['cache size']}"
    facts = {"cpu": cpu, "cpu_id": f"{info.get('vendor_id', '?')} {cpu_id}".strip(),
             "isa": torch.backends.cpu.get_cpu_capability(), "cores": os.cpu_count(), "python": platform.python_version(),
             "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name()
    return facts
