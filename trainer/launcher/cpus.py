"""How many CPUs this pod may use, and how many intra-op threads each worker gets.

torchrun sets OMP_NUM_THREADS=1 for every worker when it starts more than one, which leaves
most of a 32-core CPU node idle; torch alone would start one thread per host core in each
worker, far beyond a pod's CPU limit. Splitting the pod's CPUs among its workers avoids both.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"


def available_cpus(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit visible: the affinity mask is all we know
    return cpus


def threads_per_worker(nproc_per_node: int, cpus: int) -> int:
    return max(1, cpus // max(1, nproc_per_node))
