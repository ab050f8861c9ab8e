"""What every notebook needs: find the data folder, read its CSVs (design.md's schemas), tell
current rows from stale ones, and save figures that are never empty.

The data folder is plots/data/<gpu>/ (one per GPU). It holds results CSVs (any name; recognized
by the results header), ceilings.csv, traffic.csv and env.txt. Rows are keyed by (stage, gpu, B,
H, N, D, dtype, causal); where a key appears more than once the row read last wins, reading the
files in name order and each file top to bottom (so a later run of the same file wins).
"""

import glob
import hashlib
import os

import pandas as pd

RESULTS_COLUMNS = ["stage", "gpu", "B", "H", "N", "D", "dtype", "causal", "ms_median", "ms_min", "tflops", "gbps",
                   "peak_bytes", "max_abs_err", "rel_l2_err", "status", "source_hash", "note"]
CEILINGS_COLUMNS = ["gpu", "metric", "value", "unit"]
TRAFFIC_COLUMNS = ["stage", "gpu", "B", "H", "N", "D", "dtype", "dram_read_bytes", "dram_write_bytes", "l2_bytes",
                   "predicted_bytes"]
KEY = ["stage", "gpu", "B", "H", "N", "D", "dtype", "causal"]
PEERS = ["torch_flash", "torch_efficient", "torch_cudnn", "torch_math"]
# The ceiling a row of each precision is measured against (scripts/ceilings.py).
CEILING_OF_DTYPE = {"fp32": "fp32_sgemm_tf32_off", "fp16": "fp16_tensor_matmul", "bf16": "bf16_tensor_matmul"}

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def find_data_dir(data_dir=None):
    """The folder given, else $FA_DATA_DIR, else the one folder under plots/data/ (None if none)."""
    data_dir = data_dir or os.environ.get("FA_DATA_DIR")
    if data_dir:
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"data folder {data_dir} does not exist")
        return os.path.abspath(data_dir)
    folders = sorted(p for p in glob.glob(os.path.join(REPO, "plots", "data", "*")) if os.path.isdir(p))
    if not folders:
        print("no data yet: plots/data/ has no GPU folder (run the GPU suite, or set DATA_DIR)")
        return None
    if len(folders) > 1:
        print(f"several GPU folders: {', '.join(os.path.basename(f) for f in folders)}; "
              f"using {os.path.basename(folders[0])} (set DATA_DIR to choose)")
    return folders[0]


def plots_dir(plots=None):
    folder = plots or os.environ.get("FA_PLOTS_DIR") or os.path.join(REPO, "plots")
    os.makedirs(folder, exist_ok=True)
    return folder


def _header(path):
    with open(path, newline="") as handle:
        return [name.strip() for name in handle.readline().strip().split(",")]


def _csv_files(data_dir, columns):
    if data_dir is None:
        return []
    return [p for p in sorted(glob.glob(os.path.join(data_dir, "*.csv"))) if _header(p) == columns]


def unknown_csvs(data_dir):
    """CSV files in the folder that match no schema: said out loud, never silently dropped."""
    if data_dir is None:
        return []
    known = (RESULTS_COLUMNS, CEILINGS_COLUMNS, TRAFFIC_COLUMNS)
    return [p for p in sorted(glob.glob(os.path.join(data_dir, "*.csv"))) if _header(p) not in known]


def load_results(data_dir, exclude=()):
    """Every results row of the folder, latest per key; `exclude` drops files whose name starts
    with one of the prefixes (the timing notebooks leave out memory*.csv: single-run timings)."""
    for path in unknown_csvs(data_dir):
        print(f"ignoring {os.path.basename(path)}: its header matches none of design.md's schemas")
    files = [p for p in _csv_files(data_dir, RESULTS_COLUMNS)
             if not os.path.basename(p).startswith(tuple(exclude))]
    frames = []
    for path in files:
        frame = pd.read_csv(path, skipinitialspace=True, dtype={"source_hash": str, "note": str})
        frame["file"] = os.path.basename(path)
        frames.append(frame)
    if not frames or sum(len(f) for f in frames) == 0:
        return None
    results = pd.concat(frames, ignore_index=True)
    for column in ["B", "H", "N", "D", "causal", "ms_median", "ms_min", "tflops", "gbps", "peak_bytes",
                   "max_abs_err", "rel_l2_err"]:
        results[column] = pd.to_numeric(results[column], errors="coerce")
    results["source_hash"] = results["source_hash"].fillna("")
    results["note"] = results["note"].fillna("")
    results = results.drop_duplicates(subset=KEY, keep="last").reset_index(drop=True)
    results["flops"] = 4.0 * results.B * results.H * results.N**2 * results.D
    results.loc[results.causal == 1, "flops"] /= 2
    return results


def load_ceilings(data_dir):
    """{metric: value} of ceilings.csv ({} when there is none)."""
    files = _csv_files(data_dir, CEILINGS_COLUMNS)
    if not files:
        return {}
    frame = pd.concat([pd.read_csv(p, skipinitialspace=True) for p in files])
    return dict(zip(frame.metric, pd.to_numeric(frame.value)))


def load_traffic(data_dir):
    files = _csv_files(data_dir, TRAFFIC_COLUMNS)
    if not files:
        return None
    traffic = pd.concat([pd.read_csv(p, skipinitialspace=True) for p in files], ignore_index=True)
    traffic = traffic.drop_duplicates(subset=["stage", "gpu", "B", "H", "N", "D", "dtype"], keep="last")
    return traffic.reset_index(drop=True) if len(traffic) else None


def read_env(data_dir):
    path = os.path.join(data_dir, "env.txt") if data_dir else None
    if path and os.path.exists(path):
        with open(path) as handle:
            return handle.read().strip()
    return None


def source_hash(stage, root=REPO):
    """design.md's source_hash of a stage in this working tree, equal to
    find stages/<stage> common -type f \\( -name '*.cu' ... -o -name CMakeLists.txt \\)
      | LC_ALL=C sort | xargs sha256sum | sha256sum | cut -c1-16"""
    suffixes = (".cu", ".cuh", ".cpp", ".hpp", ".h")
    paths = []
    for folder in (os.path.join("stages", stage), "common"):
        for directory, _, names in os.walk(os.path.join(root, folder)):
            for name in names:
                full = os.path.join(directory, name)
                if (name.endswith(suffixes) or name == "CMakeLists.txt") and os.path.isfile(full) \
                        and not os.path.islink(full):
                    paths.append(os.path.relpath(full, root))
    listing = ""
    for path in sorted(paths, key=lambda p: p.encode()):
        with open(os.path.join(root, path), "rb") as handle:
            listing += f"{hashlib.sha256(handle.read()).hexdigest()}  {path}\n"
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


def currency(results):
    """Per stage: the hashes in the data and whether they match this working tree's code."""
    rows = []
    for stage in sorted(s for s in results.stage.unique() if s not in PEERS):
        here = source_hash(stage) if os.path.isdir(os.path.join(REPO, "stages", stage)) else ""
        hashes = sorted(h for h in results.loc[results.stage == stage, "source_hash"].unique() if h)
        state = "no stage folder here" if not here else ("current" if hashes == [here] else
                                                         "mixed" if here in hashes else "stale")
        rows.append({"stage": stage, "hash in data": ", ".join(hashes), "hash of this tree": here, "rows": state})
    return pd.DataFrame(rows)


PEER_COLORS = {"torch_flash": "#d62728", "torch_efficient": "#ff7f0e", "torch_cudnn": "#e377c2",
               "torch_math": "#8c564b"}


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
