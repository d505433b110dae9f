"""PNG charts of a run (matplotlib, the `plot` extra): one ratio chart per scenario, the
fill grid at a glance and the overlap timeline."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from pathlib import Path

from .context import Outcome
from .fill import GridCell, fill_grid
from .report import Row

LANES = ("forward", "fill (worker threads)", "wait", "apply")


def _ratio_chart(scenario: str, rows: Sequence[Row], path: Path) -> None:
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r.ratio_p50 is not None]
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(shown) + 1.6))
    labels = [f"{r.point} | {r.variant}" for r in shown]
    colors = ["#999999" if r.variant == r.baseline else "#3b75af" for r in shown]
    positions = range(len(shown))
    ax.barh(positions, [r.ratio_p50 or 0.0 for r in shown], color=colors, label="p50")
    ax.scatter(
        [r.ratio_p99 or 0.0 for r in shown], positions, marker="|", color="black", label="p99"
    )
    for position, row in zip(positions, shown, strict=True):
        if row.target is not None:
            ax.plot(row.target.value, position, "rv", markersize=6)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_yticks(list(positions), labels, fontsize=7)
    ax.invert_yaxis()
    unit = "tokens/s" if any(r.unit == "tok/s" for r in shown) else "time"
    ax.set_xlabel(f"{unit} / baseline of the same point, log scale (grey: baseline; red: target)")
    ax.set_title(f"grammarmask bench: {scenario}")
    ax.legend(loc="lower right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _fill_grid_chart(grids: Mapping[str, Mapping[tuple[int, int], GridCell]], path: Path) -> None:
    """One heat map per vocabulary: B x D, the pool with 2 workers over the best other
    variant (a bar per variant and point runs to thousands of pixels on the full grid)."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm

    fig, axes = plt.subplots(
        1, len(grids), figsize=(3.4 * len(grids) + 1.4, 3.6), squeeze=False, sharey=True
    )
    norm = TwoSlopeNorm(vmin=0.5, vcenter=1.0, vmax=2.0)
    batches = sorted({b for cells in grids.values() for b, _ in cells})
    depths = sorted({d for cells in grids.values() for _, d in cells})
    image = None
    for ax, (name, cells) in zip(axes[0], grids.items(), strict=True):
        values = [[_over_best(cells, b, d) for d in depths] for b in batches]
        image = ax.imshow(values, cmap="RdBu_r", norm=norm, aspect="auto")
        for (i, b), (j, d) in itertools.product(enumerate(batches), enumerate(depths)):
            cell = cells.get((b, d))
            if cell is not None:
                missed = "\nmissed" if cell.met is False else ""
                dark = not 0.65 <= cell.over_best <= 1.6
                ax.text(
                    j,
                    i,
                    f"{cell.over_best:.2f}\n{cell.over_naive:.2f}x naive{missed}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if dark else "black",
                )
        ax.set_xticks(range(len(depths)), [f"D={d}" for d in depths])
        ax.set_title(name, fontsize=9)
    axes[0][0].set_yticks(range(len(batches)), [f"B={b}" for b in batches])
    assert image is not None
    fig.colorbar(image, ax=axes[0].tolist(), label="time over the best other variant")
    fig.suptitle("fill: the pool with 2 workers (blue: faster than every other variant)")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _over_best(cells: Mapping[tuple[int, int], GridCell], requests: int, drafts: int) -> float:
    cell = cells.get((requests, drafts))
    return float("nan") if cell is None else cell.over_best


def _timeline_chart(spans: Sequence[tuple[int, str, float, float]], path: Path) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 2.6))
    for lane, name in enumerate(LANES):
        bars = [
            (start * 1e3, (end - start) * 1e3) for _, label, start, end in spans if label == name
        ]
        ax.broken_barh(bars, (lane - 0.35, 0.7), color=f"C{lane}")
    ax.set_yticks(range(len(LANES)), LANES)
    ax.invert_yaxis()
    ax.set_xlabel("ms since the first fill_async")
    ax.set_title("overlap: masks filled on worker threads while the forward runs")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def write_plots(
    rows: Sequence[Row], outcomes: Mapping[str, Outcome], directory: Path
) -> list[Path]:
    """One `<scenario>.png` per scenario with figures, plus `fill_grid.png` and
    `overlap_timeline.png`."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for scenario in dict.fromkeys(r.scenario for r in rows):
        mine = [r for r in rows if r.scenario == scenario]
        if any(r.ratio_p50 is not None for r in mine):
            path = directory / f"{scenario}.png"
            _ratio_chart(scenario, mine, path)
            written.append(path)
    grids = fill_grid(rows)
    if grids:
        path = directory / "fill_grid.png"
        _fill_grid_chart(grids, path)
        written.append(path)
    overlap = outcomes.get("overlap")
    if overlap is not None and overlap.timeline:
        path = directory / "overlap_timeline.png"
        _timeline_chart(overlap.timeline, path)
        written.append(path)
    return written
