"""The Snakemake process's cyclic garbage collector, tuned for a process that builds a large DAG.

CPython's collector starts a young collection after every 700 net container allocations and a
full one after every 100 young ones; a full collection traverses every tracked object. Building a
DAG allocates hundreds of thousands of long-lived objects (jobs, file objects, wildcards), so the
full collections grow with the DAG while finding almost nothing to free. Measured with
`gc.callbacks` over a cold dry run (`-n -q rules`, 2-core Xeon, CPU s in the collector):

| study | default thresholds | tuned | of which before the Snakefile's parse |
|---|---|---|---|
| default (316 jobs) | 0.24-0.27 (367 young, 3 full) | 0.17 | 0.12 (234 young, 2 full) |
| Fashion (995 jobs) | 0.57-0.65 (743 young, 6 full) | 0.16 | |

The collections before the parse are Snakemake's start, out of the workflow's reach.

Raising the thresholds is what mypy does for the same reason (`gc.set_threshold(200_000, 30, 30)`
in its `main`). Freezing first moves everything alive at the parse (imported modules: Snakemake's,
this package's) to the permanent generation, so a full collection later in a long run does not
traverse them again. Only the Snakemake process is tuned: jobs run in processes started afresh
(the fork server, `python -m` steps), with the interpreter's defaults.
"""
from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000  # net container allocations between young collections (CPython: 700)
OLDER_THRESHOLDS = (50, 50)  # young collections per middle one, middle ones per full one (CPython: 10, 10)


def tune_collector() -> tuple[int, int, int]:
    """Freeze the objects alive now and raise the collection thresholds; returns the thresholds
    set. Garbage in reference cycles is still collected, only less often."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
    return gc.get_threshold()
