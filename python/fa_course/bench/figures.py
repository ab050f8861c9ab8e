"""How the notebooks draw: one colour ramp for our stages and warm colours for PyTorch's backends,
line styles and labels, shape labels, and saving figures that are never empty. Needs matplotlib
(requirements.txt)."""

import os

from . import data
from . import schema

PEER_COLORS = {"torch_flash": "#d62728", "torch_efficient": "#ff7f0e", "torch_cudnn": "#e377c2",
               "torch_math": "#8c564b", "torch_default": "#7f7f7f", "cudnn_fp8": "#17becf"}


def plots_dir(plots=None, root=data.REPO):
    """The folder given, else $FA_PLOTS_DIR, else plots/ of the checkout at `root` (made if missing)."""
    folder = plots or os.environ.get("FA_PLOTS_DIR") or os.path.join(root, "plots")
    os.makedirs(folder, exist_ok=True)
    return folder


def colors_for(names):
    """Our stages along one colour ramp (the progression reads dark to light), PyTorch's backends
    in warm colours of their own."""
    import matplotlib.pyplot as plt

    ours = sorted(n for n in names if n not in schema.PEERS)
    colors = {n: plt.cm.viridis(i / max(1, len(ours) - 1) * 0.9) for i, n in enumerate(ours)}
    colors.update({n: PEER_COLORS.get(n, "grey") for n in names if n in schema.PEERS})
    return colors


def style_for(stage, dtype):
    """Line style and marker: solid for our stages, dashed for PyTorch; circles for 16-bit rows,
    triangles for FP32 rows."""
    return ("--" if stage in schema.PEERS else "-"), ("^" if dtype == "fp32" else "o")


def label(stage, dtype):
    return f"{stage} ({dtype})"


def shape_label(b, hq, hkv, nq, nk, d, causal=0, pass_="fwd"):
    """B=4 H=16 N=4096 D=128 for a square problem; Hq/Hkv and Nq/Nk spelled out where they differ."""
    heads = f"H={hq}" if hq == hkv else f"Hq={hq} Hkv={hkv}"
    seq = f"N={nq}" if nq == nk else f"Nq={nq} Nk={nk}"
    extra = (" causal" if causal else "") + ("" if pass_ == "fwd" else f" {pass_}")
    return f"B={b} {heads} {seq} D={d}{extra}"


def save(fig, name, plots=None, root=data.REPO):
    """Saves the figure as <plots_dir>/<name>.png, refusing one with an empty axes: a plot that
    should show data and shows none is an error, not a picture."""
    empty = [ax.get_title() or f"axes {i}" for i, ax in enumerate(fig.axes) if ax.get_label() != "<colorbar>"
             and not ax.has_data()]
    if empty:
        raise ValueError(f"{name}: empty plot(s): {', '.join(empty)}")
    path = os.path.join(plots_dir(plots, root), f"{name}.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    shown = os.path.relpath(path, root) if os.path.abspath(path).startswith(root + os.sep) else path
    print(f"wrote {shown}")
    return path
