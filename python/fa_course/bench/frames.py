"""The notebooks' view of a data folder: fa_course.bench.data reads and checks it (one file per
kind; a duplicate key or a second file of a kind raises), this module turns what it read into
pandas frames and tells current rows from stale ones. Needs pandas (requirements.txt).

The data folder is plots/data/<gpu>/ (one per GPU), DESIGN.md's "one coherent data set per GPU":
results.csv (the stage executables' benchmark), memory.csv (the memory sweep), torch.csv (our stages
and PyTorch's SDPA backends on the same tensors), torch_graph.csv (the same for decoding, each call
timed as a CUDA graph replay), fp8.csv (stage 14 beside stage 10 and cuDNN's FP16 and FP8 attention,
scripts/fp8_peers.py), ceilings.csv, traffic.csv, env.txt. Rows have the general-shape
columns (B, Hq, Hkv, Nq, Nk, D, ..., pass); files of the square era (B, H, N, D) are converted on
read. Within a kind a key is unique (fa_course.bench.data.check); a notebook that reads several kinds
names their order, and where a key is in more than one, the first kind's row is used and the
notebook says how many.
"""

import glob
import os

import pandas as pd

from . import data
from . import schema

# The ceiling a row of each precision is measured against (scripts/ceilings.py).
CEILING_OF_DTYPE = {"fp32": "fp32_sgemm_tf32_off", "fp16": "fp16_tensor_matmul", "bf16": "bf16_tensor_matmul"}
# ... and of an FP8 product (stage 14's e4m3 operands, cuDNN's FP8 attention)
FP8_CEILING = "fp8_tensor_matmul"
NUMERIC = ["B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "ms_median", "ms_min", "tflops", "gbps", "peak_bytes",
           "max_abs_err", "rel_l2_err", "dram_read_bytes", "dram_write_bytes", "l2_bytes", "predicted_bytes", "value"]
SHAPE = ["B", "Hq", "Hkv", "Nq", "Nk", "D", "causal", "pass"]


def find_data_folder(data_dir=None, root=data.REPO):
    """The folder given, else $FA_DATA_DIR, else the one folder under plots/data/ of the checkout at
    `root`, or of several the fullest (the most kinds of data file: a GPU measured on a few stages
    only is not the default). None if there is none."""
    data_dir = data_dir or os.environ.get("FA_DATA_DIR")
    if data_dir:
        if not os.path.isdir(data_dir):
            raise FileNotFoundError(f"data folder {data_dir} does not exist")
        return os.path.abspath(data_dir)
    folders = sorted(p for p in glob.glob(os.path.join(root, "plots", "data", "*")) if os.path.isdir(p))
    if not folders:
        print("no data yet: plots/data/ has no GPU folder (run the GPU suite, or set DATA_DIR)")
        return None
    fullest = max(folders, key=lambda folder: sum(os.path.isfile(os.path.join(folder, kind.file))
                                                  for kind in data.KINDS.values()))
    if len(folders) > 1:
        print(f"several GPU folders: {', '.join(os.path.basename(f) for f in folders)}; "
              f"using the fullest, {os.path.basename(fullest)} (set DATA_DIR to choose)")
    return fullest


_LOADED = {}


def load(data_dir):
    """{kind: rows} of the data folder, checked (raises fa_course.bench.data.DataError on a duplicate
    key, a second file of a kind, an unknown CSV). Read once per folder."""
    if data_dir is None:
        return {kind: [] for kind in data.KINDS}
    if data_dir not in _LOADED:
        _LOADED[data_dir] = data.load(data_dir)
    return _LOADED[data_dir]


def _frame(rows, kind):
    frame = pd.DataFrame(rows, columns=data.KINDS[kind].columns)
    for column in NUMERIC:
        if column in frame:
            frame[column] = pd.to_numeric(frame[column], errors="coerce")
    for column in ("source_hash", "note"):
        if column in frame:
            frame[column] = frame[column].fillna("")
    frame["file"] = data.KINDS[kind].file
    return frame


def flops(frame):
    """DESIGN.md's FLOP count of every row (schema.attention_flops)."""
    return [schema.attention_flops(b, hq, nq, nk, d, bool(c), p)
            for b, hq, nq, nk, d, c, p in zip(frame.B, frame.Hq, frame.Nq, frame.Nk, frame.D, frame.causal,
                                              frame["pass"])]


def load_results(data_dir, kinds=("torch", "results")):
    """The results rows of `kinds` (of results, memory, torch, torch_graph) as one frame with a
    `flops` column and `file` naming the kind's file. A key in several kinds is taken from the first
    kind listed, said out loud. None when there are no rows."""
    loaded = load(data_dir)
    frames = [_frame(loaded[kind], kind) for kind in kinds if loaded[kind]]
    if not frames:
        return None
    results = pd.concat(frames, ignore_index=True)
    taken = results.duplicated(subset=schema.RESULTS_KEY, keep="first")
    if taken.any():
        dropped = results[taken].file.value_counts()
        print(f"{int(taken.sum())} keys measured in more than one of {', '.join(k + '.csv' for k in kinds)}: "
              f"using the first one's rows (left out: " +
              ", ".join(f"{n} of {f}" for f, n in dropped.items()) + ")")
        results = results[~taken]
    results = results.reset_index(drop=True)
    results["flops"] = flops(results)
    return results


def at_shape(frame, columns, values):
    """The rows of `frame` whose `columns` equal `values` (a tuple from a groupby over them)."""
    mask = pd.Series(True, index=frame.index)
    for column, value in zip(columns, values):
        mask &= frame[column] == value
    return frame[mask]


def square(frame):
    """The forward rows of square problems (Hq = Hkv, Nq = Nk): the shapes of the course's first
    part, which the progression, memory and roofline figures draw."""
    if frame is None:
        return None
    return frame[(frame.Hq == frame.Hkv) & (frame.Nq == frame.Nk) & (frame["pass"] == "fwd")]


MODEL_FOLDER = os.path.join("plots", "model")


def load_model_table(name, root=data.REPO):
    """A table of a CPU model, the same on every GPU, as a frame: plots/model/<name>.csv of the checkout
    at `root` (fp8_accuracy: stage 14's accuracy study, `14_fp8_accuracy --csv`). None when it is absent."""
    path = os.path.join(root, MODEL_FOLDER, f"{name}.csv")
    if not os.path.exists(path):
        print(f"no data yet: {os.path.relpath(path, root)} does not exist")
        return None
    return pd.read_csv(path)


def load_ceilings(data_dir):
    """{metric: value} of ceilings.csv ({} when there is none)."""
    return {r["metric"]: float(r["value"]) for r in load(data_dir)["ceilings"]}


def load_traffic(data_dir):
    """traffic.csv as a frame (None when there is none)."""
    rows = load(data_dir)["traffic"]
    return _frame(rows, "traffic") if rows else None


def env_text(data_dir):
    """env.txt of the data folder as it is written (None when there is none)."""
    path = os.path.join(data_dir, data.ENV_FILE) if data_dir else None
    if path and os.path.exists(path):
        with open(path) as handle:
            return handle.read().strip()
    return None


def currency(results, data_dir=None, root=data.REPO):
    """Per stage and file: the hashes in the data, those of the tree at `root`, and how many rows are
    current (that tree's code), restamped to it (data_dir's restamps.csv) or stale
    (python3 -m fa_course.bench.data stale)."""
    restamps = data.read_restamps(data_dir) if data_dir else []
    ours = results[~results.stage.isin(schema.PEERS)]
    here = data.current_hashes({data.stage_folder(s) for s in ours.stage.unique()}, root)
    rows = []
    for (stage, file), group in ours.groupby(["stage", "file"]):
        hashes = [h if isinstance(h, str) else "" for h in group.source_hash]
        states = [data.row_state(file[:-len(".csv")], {"stage": stage, "source_hash": h}, here, restamps)
                  for h in hashes]
        rows.append({"stage": stage, "file": file, "hash in data": ", ".join(sorted(set(hashes) - {""})),
                     "hash of this tree": here.get(data.stage_folder(stage), "no stage folder here"),
                     **{state: states.count(state) for state in ("current", "restamped", "stale")}})
    return pd.DataFrame(rows)
