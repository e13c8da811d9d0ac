"""What a run or a benchmark ran on: CPU model, cores, Python and torch versions, threads, GPU.

Training logs it at the start of each session (metrics.jsonl), so that two runs of the same
command that part in their last digits can be told apart by the processor they ran on."""

from __future__ import annotations

import os
import platform

import torch


def machine_facts() -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    facts = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
             "torch": torch.__version__, "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        facts["gpu"] = torch.cuda.get_device_name()
    return facts
