"""`python -m tests.runner.light_server <socket> [lock fd]`: the fork server preloading numpy only."""
import sys
from pathlib import Path

import pipeline_src.runner.forkserver as f

if __name__ == "__main__":
    f.PRELOAD, f.PRELOAD_STEPS, f.IDLE_SECONDS = ("numpy",), False, 20
    f.serve(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else None)
