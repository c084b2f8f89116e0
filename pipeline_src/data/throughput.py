"""Images per second of a job's data path, printed to its log (one line per epoch or per job), so
a slow data path shows next to the GPU's utilisation."""
from __future__ import annotations

import time

from pipeline_src.store.job_counters import note_logged_images


class Throughput:
    """Counts images and the wall time since the last line.

    Args:
        desc: what is measured (the line's prefix).
    """

    def __init__(self, desc: str) -> None:
        self.desc, self.images, self.t0 = desc, 0, time.perf_counter()

    def add(self, n: int) -> None:
        self.images += n

    def line(self, what: str = "") -> str:
        """The images/s since the last line, then starts counting afresh."""
        seconds = max(time.perf_counter() - self.t0, 1e-9)
        text = f"{self.desc}{what}: {self.images} images in {seconds:.2f} s, {self.images / seconds:.1f} images/s"
        note_logged_images(self.images)  # the job's images where its model loop counts none itself
        self.images, self.t0 = 0, time.perf_counter()
        return text

    def report(self, what: str = "") -> None:
        print(self.line(what), flush=True)

    def epoch(self, epoch: int, epochs: int, n: int, loss: float) -> None:
        """Print the progress line of an epoch of `n` images."""
        self.images = n
        self.report(f": epoch {epoch + 1}/{epochs} loss {loss:.4f}")
