"""What every notebook needs: find the data folder, read it through python/fa_course/bench/data.py (one
file per kind; a duplicate key or a second file of a kind raises), tell current rows from stale
ones, and save figures that are never empty.

The data folder is plots/data/<gpu>/ (one per GPU), design.md's "one coherent data set per GPU":
results.csv (the stage executables' benchmark), memory.csv (the memory sweep), torch.csv (our stages
and PyTorch's SDPA backends on the same tensors), torch_graph.csv (the same for decoding, each call
timed as a CUDA graph replay), ceilings.csv, traffic.csv, env.txt. Rows have the general-shape
columns (B, Hq, Hkv, Nq, Nk, D, ..., pass); files of the square era (B, H, N, D) are converted on
read. Within a kind a key is unique (fa_course.bench.data.check); a notebook that reads several kinds
names their order, and where a key is in more than one, the first kind's row is used and the
notebook says how many.
"""

import glob
import os
import sys

import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# The course's Python package, from this checkout (no pip install needed).
if os.path.join(REPO, "python") not in sys.path:
    sys.path.insert(0, os.path.join(REPO, "python"))

from fa_course.bench import data as fa_dataset  # noqa: E402
from fa_course.bench import schema  # noqa: E402

DataError = fa_dataset.DataError
PEERS = schema.PEERS
KEY = schema.RESULTS_KEY
# The ceiling a row of each precision is measured against (scripts/ceilings.py).
CEILING_OF_DTYPE = {"fp32": "fp32_sgemm_tf32_off", "fp16": "fp16_tensor_matmul", "bf16": "bf16_tensor_matmul"}
NUMERIC = ["B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "ms_median", "ms_min", "tflops", "gbps", "peak_bytes",
           "max_abs_err", "rel_l2_err", "dram_read_bytes", "dram_write_bytes", "l2_bytes", "predicted_bytes", "value"]


def find_data_dir(data_dir=None):
    """The folder given, else $FA_DATA_DIR, else the one folder under plots/data/, or of several the
    fullest (the most kinds of data file: a GPU measured on a few stages only is not the default).
    None if there is none."""
    data_dir = data_dir or os.environ.get("FA_DATA_DIR")
    if data_dir:
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"data folder {data_dir} does not exist")
        return os.path.abspath(data_dir)
    folders = sorted(p for p in glob.glob(os.path.join(REPO, "plots", "data", "*")) if os.path.isdir(p))
    if not folders:
        print("no data yet: plots/data/ has no GPU folder (run the GPU suite, or set DATA_DIR)")
        return None
    fullest = max(folders, key=lambda folder: sum(os.path.isfile(os.path.join(folder, kind.file))
                                                  for kind in fa_dataset.KINDS.values()))
    if len(folders) > 1:
        print(f"several GPU folders: {', '.join(os.path.basename(f) for f in folders)}; "
              f"using the fullest, {os.path.basename(fullest)} (set DATA_DIR to choose)")
    return fullest


def plots_dir(plots=None):
    folder = plots or os.environ.get("FA_PLOTS_DIR") or os.path.join(REPO, "plots")
    os.makedirs(folder, exist_ok=True)
    return folder


_LOADED = {}


def load(data_dir):
    """{kind: rows} of the data folder, checked (raises fa_course.bench.data.DataError on a duplicate key,
    a second file of a kind, an unknown CSV). Read once per folder."""
    if data_dir is None:
        return {kind: [] for kind in fa_dataset.KINDS}
    if data_dir not in _LOADED:
        _LOADED[data_dir] = fa_dataset.load(data_dir)
    return _LOADED[data_dir]


def _frame(rows, kind):
    frame = pd.DataFrame(rows, columns=fa_dataset.KINDS[kind].columns)
    for column in NUMERIC:
        if column in frame:
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    for column in ("source_hash", "note"):
        if column in frame:
            frame[column] = frame[column].fillna("")
    frame["file"] = fa_dataset.KINDS[kind].file
    return frame


def flops(frame):
    """design.md's FLOP count of every row (schema.attention_flops)."""
    return [schema.attention_flops(b, hq, nq, nk, d, bool(c), p)
            for b, hq, nq, nk, d, c, p in zip(frame.B, frame.Hq, frame.Nq, frame.Nk, frame.D, frame.causal,
                                              frame["pass"])]


def load_results(data_dir, kinds=("torch", "results")):
    """The results rows of `kinds` (of results, memory, torch, torch_graph) as one frame with a
    `flops` column and `file` naming the kind's file. A key in several kinds is taken from the first
    kind listed, said out loud. None when there are no rows."""
    data = load(data_dir)
    frames = [_frame(data[kind], kind) for kind in kinds if data[kind]]
    if not frames:
        return None
    results = pd.concat(frames, ignore_index=True)
    taken = results.duplicated(subset=KEY, keep="first")
    if taken.any():
        dropped = results[taken].file.value_counts()
        print(f"{int(taken.sum())} keys measured in more than one of {', '.join(k + '.csv' for k in kinds)}: "
              f"using the first one's rows (left out: " +
              ", ".join(f"{n} of {f}" for f, n in dropped.items()) + ")")
        results = results[~taken]
    results = results.reset_index(drop=True)
    results["flops"] = flops(results)
    return results


SHAPE = ["B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "pass"]


def at_shape(frame, columns, values):
    """The rows of `frame` whose `columns` equal `values` (a tuple from a groupby over them)."""
    mask = pd.Series(True, index=frame.index)
    for column, value in zip(columns, values):
        mask &= frame[column] == value
    return frame[mask]


def shape_label(b, hq, hkv, nq, nk, d, causal=0, pass_="fwd"):
    """B=4 H=16 N=4096 D=128 for a square problem; Hq/Hkv and Nq/Nk spelled out where they differ."""
    heads = f"H={hq}" if hq == hkv else f"Hq={hq} Hkv={hkv}"
    seq = f"N={nq}" if nq == nk else f"Nq={nq} Nk={nk}"
    extra = (" causal" if causal else "") + ("" if pass_ == "fwd" else f" {pass_}")
    return f"B={b} {heads} {seq} D={d}{extra}"


def square(frame):
    """The forward rows of square problems (Hq = Hkv, Nq = Nk): the shapes of the course's first
    part, which the progression, memory and roofline figures draw."""
    if frame is None:
        return None
    return frame[(frame.Hq == frame.Hkv) & (frame.Nq == frame.Nk) & (frame["pass"] == "fwd")]


def load_ceilings(data_dir):
    """{metric: value} of ceilings.csv ({} when there is none)."""
    rows = load(data_dir)["ceilings"]
    return {r["metric"]: float(r["value"]) for r in rows}


def load_traffic(data_dir):
    rows = load(data_dir)["traffic"]
    return _frame(rows, "traffic") if rows else None


def read_env(data_dir):
    path = os.path.join(data_dir, fa_dataset.ENV_FILE) if data_dir else None
    if path and os.path.exists(path):
        with open(path) as handle:
            return handle.read().strip()
    return None


def source_hash(stage, root=REPO):
    """design.md's source_hash of a stage folder in this working tree (scripts/source_hash.py)."""
    return fa_dataset.current_hashes([stage], root).get(stage, "")


def currency(results, data_dir=None):
    """Per stage and file: the hashes in the data, this working tree's, and how many rows are current
    (this tree's code), restamped to it (data_dir's restamps.csv) or stale (fa_course.bench.data stale)."""
    restamps = fa_dataset.read_restamps(data_dir) if data_dir else []
    ours = results[~results.stage.isin(PEERS)]
    here = fa_dataset.current_hashes({fa_dataset.stage_folder(s) for s in ours.stage.unique()})
    rows = []
    for (stage, file), group in ours.groupby(["stage", "file"]):
        hashes = [h if isinstance(h, str) else "" for h in group.source_hash]
        states = [fa_dataset.row_state(file[:-len(".csv")], {"stage": stage, "source_hash": h}, here, restamps)
                  for h in hashes]
        rows.append({"stage": stage, "file": file, "hash in data": ", ".join(sorted(set(hashes) - {""})),
                     "hash of this tree": here.get(fa_dataset.stage_folder(stage), "no stage folder here"),
                     **{state: states.count(state) for state in ("current", "restamped", "stale")}})
    return pd.DataFrame(rows)


PEER_COLORS = {"torch_flash": "#d62728", "torch_efficient": "#ff7f0e", "torch_cudnn": "#e377c2",
               "torch_math": "#8c564b", "torch_default": "#7f7f7f"}


def colors_for(names):
    """Our stages along one colour ramp (the progression reads dark to light), PyTorch's backends
    in warm colours of their own."""
    import matplotlib.pyplot as plt

    ours = sorted(n for n in names if n not in PEERS)
    colors = {n: plt.cm.viridis(i / max(1, len(ours) - 1) * 0.9) for i, n in enumerate(ours)}
    colors.update({n: PEER_COLORS.get(n, "grey") for n in names if n in PEERS})
    return colors


def style_for(stage, dtype):
    """Line style and marker: solid for our stages, dashed for PyTorch; circles for 16-bit rows,
    triangles for FP32 rows."""
    return ("--" if stage in PEERS else "-"), ("^" if dtype == "fp32" else "o")


def label(stage, dtype):
    return f"{stage} ({dtype})"


def save(fig, name, plots=None):
    """Saves the figure as plots/<name>.png, refusing one with an empty axes: a plot that should
    show data and shows none is an error, not a picture."""
    empty = [ax.get_title() or f"axes {i}" for i, ax in enumerate(fig.axes) if ax.get_label() != "<colorbar>"
             and not ax.has_data()]
    if empty:
        raise ValueError(f"{name}: empty plot(s): {', '.join(empty)}")
    path = os.path.join(plots_dir(plots), f"{name}.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    shown = os.path.relpath(path, REPO) if os.path.abspath(path).startswith(REPO + os.sep) else path
    print(f"wrote {shown}")
    return path
