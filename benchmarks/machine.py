"""Machine facts every benchmark prints next to its figures."""

from __future__ import annotations

import os
import platform


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
    facts = {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            facts["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    return facts


def print_facts() -> None:
    print("machine: " + ", ".join(f"{k}={v}" for k, v in machine_facts().items()))
