"""Log axes of the report's figures are labelled in plain numbers (`reports/files.plain_log_ticks`):
at the study's values where given, else where matplotlib's log scale puts its labels; never in
mathtext, whose parser the report would otherwise build (~0.1-0.5 s)."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from pipeline_src.reports.files import plain_log_ticks  # noqa: E402


def labels(axis) -> list[str]:
    return [t.get_text() for t in axis.get_majorticklabels() + axis.get_minorticklabels() if t.get_text()]


def test_ticks_at_the_study_values_and_plain_scale_labels() -> None:
    fig, ax = plt.subplots()
    ax.plot([0.001, 0.003, 0.01], [0.3, 1.0, 2.2])
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain_log_ticks(ax.xaxis, [0.01, 0.001, 0.003, 0.001])
    plain_log_ticks(ax.yaxis)
    fig.canvas.draw()
    assert labels(ax.xaxis) == ["0.001", "0.003", "0.01"]
    y = labels(ax.yaxis)
    assert "1" in y and len(y) >= 3  # a narrow range: the scale labels minor ticks too
    assert not any("$" in s or "e-" in s for s in labels(ax.xaxis) + y)
    plt.close(fig)


def test_the_default_log_labels_are_mathtext() -> None:
    # what the helper replaces: if matplotlib stops using mathtext here, the helper can go
    fig, ax = plt.subplots()
    ax.plot([0.001, 0.01], [1, 2])
    ax.set_xscale("log")
    fig.canvas.draw()
    assert any("$" in s for s in labels(ax.xaxis))
    plt.close(fig)
