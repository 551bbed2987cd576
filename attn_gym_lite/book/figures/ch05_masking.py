"""Chapter 5, masking: which masks keep the gradients exact at capacity, and what they cost."""

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.patches import Patch

from .style import SERIES_COLOURS, figure, legend_right, styled

VERDICT_COLOURS = {"ok": "tab:green", "WRONG": "tab:orange", "non-finite": "tab:red"}


@styled
def plot_masking(verdicts: dict[str, dict[str, str]], cost_points):
    """Left: the block ablation's verdicts (``ablation_verdicts``), a row per set of masks, a column
    per gradient. Right: masked and unmasked replay time against ``L`` (``mask_cost`` points)."""
    variants, names, kinds = list(verdicts), list(next(iter(verdicts.values()))), list(VERDICT_COLOURS)
    grid = np.array([[kinds.index("non-finite" if v.endswith("non-finite") else v) for v in verdicts[r].values()] for r in variants])
    fig, (table_ax, cost_ax) = figure(1, 2, height=3.8, gridspec_kw={"width_ratios": [3, 2]})
    table_ax.grid(False)
    table_ax.imshow(grid, cmap=ListedColormap(list(VERDICT_COLOURS.values())), vmin=-0.5, vmax=len(kinds) - 0.5, aspect="auto")
    table_ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
    table_ax.set_yticks(range(len(variants)), variants)
    table_ax.set(title="gradients at capacity vs the exact ones", xlabel="gradient", ylabel="masks applied")
    legend_right(table_ax, handles=[Patch(color=c, label=k) for k, c in VERDICT_COLOURS.items()])
    ls = [p["L"] for p in cost_points]
    cost_ax.plot(ls, [p["masked_us"] / 1e3 for p in cost_points], "o-", color=SERIES_COLOURS["graph replay"], label="masked")
    cost_ax.plot(ls, [p["unmasked_us"] / 1e3 for p in cost_points], "o--", color=SERIES_COLOURS["reference"], label="unmasked")
    cost_ax.set(xlabel="active tokens L (tokens)", ylabel="fwd+bwd replay (ms)", title="what the masks cost", ylim=(0, None))
    cost_ax.legend()
    return fig
