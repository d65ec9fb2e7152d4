"""The whole machine's CPU from /proc/stat, for the benchmarks that report it."""

from __future__ import annotations

import os


def machine_jiffies() -> tuple[int, int]:
    """(busy, idle) clock ticks of every core since boot: every process, short-lived ones too."""
    with open("/proc/stat") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
    return user + nice + system + irq + softirq + steal, idle + iowait


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy since boot."""
    return machine_jiffies()[0] / os.sysconf("SC_CLK_TCK")
