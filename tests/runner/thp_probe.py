"""A fork-server child's probe: its `THP_enabled` (/proc/self/status) as the exit status, 0 or 1."""
from pathlib import Path


def thp_enabled(step, args) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("THP_enabled:"):
            return int(line.split()[1])
    return 7  # no such line: this kernel does not say
