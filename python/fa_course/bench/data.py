"""One coherent data set per GPU (DESIGN.md, "Results CSV"): read, check, merge and date the data
folder plots/data/<gpu>/. Python 3 standard library only, so the GPU suite runs it on an offline
machine; the notebooks turn what it reads into pandas frames.

A data folder holds one file per kind:

  results.csv      the benchmark rows of the stage executables (the GPU suite's bench phase)
  memory.csv       the memory sweep: one run per N, single timings
  torch.csv        our stages and PyTorch's SDPA backends on the same tensors
  torch_graph.csv  our decoding stage and PyTorch's backends on the same tensors, each call timed as
                   a CUDA graph replay (scripts/compare_torch.py --timing graph): torch.csv's key
                   in a file of its own, so a graph-timed row never replaces a plain one
  fp8.csv          stage 14 (FP8) beside stage 10 in FP16 and BF16, PyTorch's cuDNN SDPA in FP16 and
                   cuDNN's FP8 attention (cudnn_fp8), on the same tensors in one process
                   (scripts/fp8_peers.py): torch.csv's key in a file of its own, so that its FP16
                   rows never replace those of scripts/compare_torch.py
  ceilings.csv     the device's measured ceilings
  traffic.csv      DRAM and L2 bytes measured with Nsight Compute
  env.txt          date, GPU, driver, CUDA, commit and the source hashes of the run that wrote it
  restamps.csv     restamps (scripts/restamp): code changes proved to leave the machine code
                   identical, which carry rows measured with one source_hash over to another

and, besides, the stages' walkthrough output (walkthrough_NN.txt), Nsight Compute reports (ncu/),
the training example's loss curves and log (training/: python/examples/train_attention.py --csv,
drawn by notebooks/training.ipynb) and the GPU suite's running log (gpu_suite_log.txt), none of them
merged row by row. Files written before
the general shapes (B, H, N, D; no pass) are converted on read: H is Hq = Hkv, N is Nq = Nk, pass is
fwd (and traffic rows without causal are non-causal).

  python3 -m fa_course.bench.data check plots/data/NVIDIA_H200      # raises on anything incoherent
  python3 -m fa_course.bench.data check --all plots/data            # every GPU folder
  python3 -m fa_course.bench.data merge OUTDIR/data plots/data/NVIDIA_H200
  python3 -m fa_course.bench.data stale plots/data/NVIDIA_H200      # rows current, restamped, stale
  python3 -m fa_course.bench.data rewrite plots/data/NVIDIA_H200    # legacy headers -> current, sorted

A merge replaces, kind by kind, the rows whose key (schema.RESULTS_KEY, CEILINGS_KEY, TRAFFIC_KEY)
the new folder has, keeps the others, and writes each file back sorted by its key; env.txt, the
walkthrough files and the ncu/ and training/ reports of the new folder replace the old ones of the same
name.
"""

import argparse
import os
import re
import shutil
import sys

from . import results as csv_files
from . import schema
from . import source_hash

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class Kind:
    """One file of a data folder: its name and the schema kind of its rows (results.py reads and
    writes them: the columns, the legacy headers, the key)."""

    def __init__(self, name, schema_kind):
        self.name, self.schema_kind = name, schema_kind
        self.columns, self.key = csv_files.KINDS[schema_kind]
        legacy = csv_files.LEGACY_KINDS.get(schema_kind)
        self.legacy = [list(legacy)] if legacy else []

    @property
    def file(self):
        return self.name + ".csv"


KINDS = {
    "results": Kind("results", "results"),
    "memory": Kind("memory", "results"),
    "torch": Kind("torch", "results"),
    "torch_graph": Kind("torch_graph", "results"),
    "fp8": Kind("fp8", "results"),
    "ceilings": Kind("ceilings", "ceilings"),
    "traffic": Kind("traffic", "traffic"),
}
ENV_FILE = "env.txt"
RESTAMPS_FILE = "restamps.csv"
RESTAMP_COLUMNS = ["stage", "kinds", "from_hash", "to_hash", "sass_digest", "host_digest", "nvcc", "arch",
                   "from_commit", "to_commit", "date"]
LOG_FILE = "gpu_suite_log.txt"
NCU_FOLDER = "ncu"
TRAINING_FOLDER = "training"
REPORT_FOLDERS = (NCU_FOLDER, TRAINING_FOLDER)
WALKTHROUGH = re.compile(r"^walkthrough_[0-9][0-9]\.txt$")
CPU = "cpu"  # the gpu column of the CPU stage's rows (common/src/runner.cpp): in any GPU's folder


class DataError(Exception):
    """A data folder that is not one coherent data set; the message says what and how to fix it."""


def gpu_folder_name(gpu):
    """plots/data/<this>/ for a device name: spaces become _ (DESIGN.md)."""
    return csv_files.gpu_folder(gpu.strip())


# ---- reading and writing one kind (python/fa_course/results.py) ----

def row_key(kind, row):
    """The row's key with numbers as numbers ("4" and "4.0" are one key)."""
    return csv_files.key_of(row, kind.key)


def read_kind(path, kind):
    """The rows of one kind's file as dicts of strings (the text as written) in the kind's current
    columns, legacy headers converted; DataError on a header of another kind, a key twice, a
    malformed line, a pass or status DESIGN.md does not know."""
    try:
        rows = csv_files.read_csv(path, kind.schema_kind, duplicates="error", typed=False)[1]
    except (csv_files.SchemaError, ValueError) as error:
        raise DataError(str(error)) from None
    for number, row in enumerate(rows, start=2):
        if "pass" in row and row["pass"] not in schema.PASSES:
            raise DataError(f"{path}: row {number - 1}: pass {row['pass']!r} is none of {', '.join(schema.PASSES)}")
        if "status" in row and row["status"] not in schema.STATUSES:
            raise DataError(f"{path}: row {number - 1}: status {row['status']!r} is none of "
                            f"{', '.join(schema.STATUSES)}")
    return rows


def write_kind(path, kind, rows):
    """Writes rows in the kind's columns, sorted by key (a stable sort), atomically."""
    rows = sorted(rows, key=lambda r: tuple((0, v, "") if isinstance(v, int) else (1, 0, str(v))
                                            for v in row_key(kind, r)))
    try:
        csv_files.write_csv(path, rows, kind.schema_kind)
    except csv_files.SchemaError as error:
        raise DataError(f"{path}: {error}") from None


# ---- the folder ----

def classify(folder):
    """{kind: path} of the folder's CSV files and the list of problems: a second file of a kind, an
    unknown CSV, an unknown file."""
    found, problems = {}, []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith("."):
            continue
        if os.path.isdir(path):
            if name not in REPORT_FOLDERS:
                problems.append(f"{name}/: an unknown folder (only {', '.join(f + '/' for f in REPORT_FOLDERS)} "
                                f"belong in a data folder)")
            continue
        if name == RESTAMPS_FILE:
            continue
        if name.endswith(".csv"):
            stem = name[:-4]
            if stem in KINDS:
                found[stem] = path
                continue
            # the longest kind it extends: torch_graph_call2 is a second torch_graph, not a second torch
            kind = max((k for k in KINDS if re.match(rf"^{k}[-_.]", stem)), key=len, default=None)
            header = _header(path)
            alike = [k.file for k in KINDS.values() if header == k.columns or header in k.legacy]
            if kind:
                problems.append(f"{name}: a second file of kind {kind} (the one file is {KINDS[kind].file}): merge "
                                f"its rows into {KINDS[kind].file}, then delete it")
            elif alike:
                problems.append(f"{name}: an unknown CSV with the header of {' / '.join(alike)}: a second file of "
                                f"that kind? merge its rows in, then delete it")
            else:
                problems.append(f"{name}: an unknown CSV (the kinds are {', '.join(k.file for k in KINDS.values())})")
            continue
        if name in (ENV_FILE, LOG_FILE, "README.md") or WALKTHROUGH.match(name):
            continue
        problems.append(f"{name}: an unknown file (known: the kinds' CSVs, {ENV_FILE}, walkthrough_NN.txt, "
                        f"{LOG_FILE}, {', '.join(f + '/' for f in REPORT_FOLDERS)})")
    return found, problems


def _header(path):
    return csv_files.read_header(path)


def load(folder):
    """{kind: rows} of a data folder (every kind; [] where its file is absent), after check()."""
    check(folder)
    found, _ = classify(folder)
    return {kind: (read_kind(found[kind], KINDS[kind]) if kind in found else []) for kind in KINDS}


def check(folder):
    """Raises DataError, naming every problem, unless the folder is one coherent data set: one file
    per kind, no unknown CSV or file, each file readable under its header, no key twice within a
    kind, one GPU (besides the CPU stage's rows, whose gpu is "cpu"). Returns {kind: row count}."""
    if not os.path.isdir(folder):
        raise DataError(f"{folder}: no such data folder")
    found, problems = classify(folder)
    counts, gpus = {}, {}
    for kind, path in found.items():
        try:
            rows = read_kind(path, KINDS[kind])
        except DataError as error:
            problems.append(str(error))
            continue
        counts[kind] = len(rows)
        for row in rows:
            if row["gpu"] != CPU:
                gpus.setdefault(row["gpu"], set()).add(KINDS[kind].file)
    if os.path.exists(os.path.join(folder, RESTAMPS_FILE)):
        try:
            read_restamps(folder)
        except DataError as error:
            problems.append(str(error))
    if len(gpus) > 1:
        problems.append("rows of several GPUs in one folder: " +
                        "; ".join(f"{g} ({', '.join(sorted(f))})" for g, f in sorted(gpus.items())))
    if problems:
        raise DataError(f"{folder} is not one coherent data set:\n  " + "\n  ".join(problems))
    return counts


def merge(new_folder, data_folder, keep_peers=False):
    """Merges a run's data folder into a GPU's data folder: per kind, the new rows replace the rows
    with the same key, the other rows stay; each file is written back sorted by key. env.txt, the
    walkthrough files and ncu/ reports of the run replace those of the same name. Both folders are
    checked first (the data folder need not exist yet), and the result after. Returns
    {kind: (replaced, added, total)}.

    A peer's row (PyTorch's backends, cuDNN's FP8) is keyed by its shape, not by the run that
    measured it, so a run that compared one stage with the peers replaces the peers that another
    stage's tables were compared with in its own run. keep_peers=True merges a peer's row only where
    the data folder has none of its key: the peers measured beside the earlier run stay."""
    check(new_folder)
    if os.path.isdir(data_folder):
        check(data_folder)
    new = load(new_folder)
    old = load(data_folder) if os.path.isdir(data_folder) else {k: [] for k in KINDS}
    new_gpus = {r["gpu"] for rows in new.values() for r in rows} - {CPU}
    old_gpus = {r["gpu"] for rows in old.values() for r in rows} - {CPU}
    if new_gpus and old_gpus and new_gpus != old_gpus:
        raise DataError(f"{new_folder} holds rows of {', '.join(sorted(new_gpus))}, {data_folder} of "
                        f"{', '.join(sorted(old_gpus))}: one folder per GPU")
    os.makedirs(data_folder, exist_ok=True)
    summary = {}
    for name, kind in KINDS.items():
        if not new[name]:
            continue
        incoming = new[name]
        if keep_peers:
            held = {row_key(kind, r) for r in old[name] if r.get("stage") in schema.PEERS}
            incoming = [r for r in incoming if row_key(kind, r) not in held]
            if not incoming:
                continue
        replacing = {row_key(kind, r) for r in incoming}
        kept = [r for r in old[name] if row_key(kind, r) not in replacing]
        write_kind(os.path.join(data_folder, kind.file), kind, kept + incoming)
        summary[name] = (len(old[name]) - len(kept), len(incoming) - (len(old[name]) - len(kept)),
                         len(kept) + len(incoming))
    for entry in sorted(os.listdir(new_folder)):
        source = os.path.join(new_folder, entry)
        if entry == ENV_FILE or WALKTHROUGH.match(entry):
            shutil.copyfile(source, os.path.join(data_folder, entry))
        elif entry in REPORT_FOLDERS and os.path.isdir(source):
            shutil.copytree(source, os.path.join(data_folder, entry), dirs_exist_ok=True)
    check(data_folder)
    return summary


def rewrite(folder):
    """Rewrites every kind's file in the current columns, sorted by key (legacy headers converted)."""
    data = load(folder)
    for name, rows in data.items():
        if rows:
            write_kind(os.path.join(folder, KINDS[name].file), KINDS[name], rows)
    return {k: len(v) for k, v in data.items() if v}


# ---- which rows are current ----

def stage_folder(stage):
    """The stage folder of a results row's stage (`07_fp16_pipelined/bf16` -> `07_fp16_pipelined`)."""
    return stage.split("/", 1)[0]


def current_hashes(stages, root=REPO):
    """{stage folder: its source_hash (scripts/source_hash.py STAGE)} for the stage folders the tree
    at `root` has."""
    hashes = {}
    for stage in sorted(set(stages)):
        if os.path.isdir(os.path.join(root, "stages", stage)):
            hashes[stage] = source_hash.stage_hash(stage, root)
    return hashes


def read_restamps(folder):
    """The restamps of a data folder (restamps.csv, written by scripts/restamp), as dicts; [] when
    there is none. Each says: rows of `stage` in the `kinds` (;-separated) measured with
    `from_hash` are rows of `to_hash`, because the two trees' machine code (SASS digest, host
    digest) and the kinds' method are the same. DataError on a malformed file."""
    path = os.path.join(folder, RESTAMPS_FILE)
    if not os.path.exists(path):
        return []
    import csv
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames != RESTAMP_COLUMNS:
            raise DataError(f"{path}: header {reader.fieldnames} is not {','.join(RESTAMP_COLUMNS)}")
        restamps = list(reader)
    hexadecimal = re.compile(r"^[0-9a-f]{16}$")
    for number, restamp in enumerate(restamps, start=1):
        kinds = restamp["kinds"].split(";")
        if not (hexadecimal.match(restamp["from_hash"]) and hexadecimal.match(restamp["to_hash"])) \
                or not all(k in KINDS for k in kinds) or not restamp["stage"]:
            raise DataError(f"{path}: restamp {number} is malformed: {restamp}")
    return restamps


def restamped_to(stage, kind, measured, target, restamps):
    """The chain of restamps (a list, [] when measured == target) that carries rows of `stage` and
    `kind` measured with hash `measured` to hash `target`; None when there is none."""
    edges = {}
    for restamp in restamps:
        if restamp["stage"] == stage and kind in restamp["kinds"].split(";"):
            edges.setdefault(restamp["from_hash"], []).append(restamp)
    paths, seen = [(measured, [])], {measured}
    while paths:
        node, chain = paths.pop(0)
        if node == target:
            return chain
        for restamp in edges.get(node, []):
            if restamp["to_hash"] not in seen:
                seen.add(restamp["to_hash"])
                paths.append((restamp["to_hash"], chain + [restamp]))
    return None


def row_state(kind, row, now, restamps):
    """"current" (the row's source_hash is this tree's), "restamped" (a chain of restamps leads from
    it to this tree's) or "stale"."""
    stage = stage_folder(row["stage"])
    measured, here = row.get("source_hash", ""), now.get(stage, "")
    if measured and measured == here:
        return "current"
    if measured and here and restamped_to(stage, kind, measured, here, restamps) is not None:
        return "restamped"
    return "stale"


def stale(folder, root=REPO):
    """Per kind and stage (peers left out): the rows, how many are current (their source_hash is
    scripts/source_hash.py STAGE of this tree), restamped (a chain of restamps in restamps.csv leads
    from their hash to this tree's) and stale (the code, its flags, nvcc or the kind's method
    changed after they were measured). Returns a list of dicts."""
    data = load(folder)
    restamps = read_restamps(folder)
    report = []
    stages = {stage_folder(r["stage"]) for rows in data.values() for r in rows
              if "stage" in r and r["stage"] not in schema.PEERS}
    now = current_hashes(stages, root)
    # the kinds of results rows (traffic rows carry no source_hash)
    for name in (k for k, kind in KINDS.items() if kind.schema_kind == "results"):
        by_stage = {}
        for row in data[name]:
            if row["stage"] in schema.PEERS:
                continue
            by_stage.setdefault(stage_folder(row["stage"]), []).append(row)
        for stage, rows in sorted(by_stage.items()):
            here = now.get(stage, "")
            states = [row_state(name, r, now, restamps) for r in rows]
            counts = {s: states.count(s) for s in ("current", "restamped", "stale")}
            if not here:
                state = "no stage folder in this tree"
            elif counts["stale"] == 0:
                state = "current" if counts["restamped"] == 0 else "restamped"
            else:
                state = "stale" if counts["stale"] == len(rows) else "mixed"
            report.append({"kind": name, "stage": stage, "rows": len(rows), **counts,
                           "hash in data": ", ".join(sorted({r.get("source_hash", "") for r in rows} - {""})) or "-",
                           "hash of this tree": here or "-", "state": state})
    return report


def stale_rows(rows, root=REPO, kind="results", folder=None):
    """The rows (of a results-like kind) whose stage is ours and which are neither from this tree's
    code nor restamped to it (the restamps of `folder`, when given)."""
    restamps = read_restamps(folder) if folder else []
    now = current_hashes({stage_folder(r["stage"]) for r in rows if r["stage"] not in schema.PEERS}, root)
    return [r for r in rows if r["stage"] not in schema.PEERS and row_state(kind, r, now, restamps) == "stale"]


# ---- env.txt ----

def read_env(folder):
    """{field: value} of env.txt ("name: value" lines); {} when there is none."""
    path = os.path.join(folder, ENV_FILE)
    fields = {}
    if os.path.exists(path):
        with open(path) as handle:
            for line in handle:
                if ":" in line:
                    name, value = line.split(":", 1)
                    fields[name.strip()] = value.strip()
    return fields


# ---- command line ----

def _print_table(rows):
    if not rows:
        return
    columns = list(rows[0])
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in columns]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in rows:
        print("  ".join(str(row[c]).ljust(w) for c, w in zip(columns, widths)))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m fa_course.bench.data", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    check_parser = commands.add_parser("check", help="fail unless the folder is one coherent data set")
    check_parser.add_argument("folder")
    check_parser.add_argument("--all", action="store_true", help="FOLDER holds GPU folders (plots/data): check each")
    merge_parser = commands.add_parser("merge", help="merge a run's data folder into a GPU's data folder")
    merge_parser.add_argument("new")
    merge_parser.add_argument("data")
    merge_parser.add_argument("--keep-peers", action="store_true",
                              help="keep the data folder's peer rows (PyTorch's backends, cuDNN's FP8) where it "
                                   "has them: for a run that measured other stages than those the peers were "
                                   "compared with")
    stale_parser = commands.add_parser("stale", help="rows current, restamped to this tree's code, or stale")
    stale_parser.add_argument("folder")
    stale_parser.add_argument("--root", default=REPO, help="the source tree (default: %(default)s)")
    stale_parser.add_argument("--fail", action="store_true", help="exit 1 when a row is stale")
    stale_parser.add_argument("--brief", action="store_true", help="one line: how many rows are current")
    stale_parser.add_argument("--kinds", nargs="+", metavar="KIND", help="only these kinds (e.g. results memory)")
    rewrite_parser = commands.add_parser("rewrite", help="rewrite the files in the current columns, sorted")
    rewrite_parser.add_argument("folder")
    args = parser.parse_args(argv)
    try:
        if args.command == "check":
            folders = ([os.path.join(args.folder, f) for f in sorted(os.listdir(args.folder))
                        if os.path.isdir(os.path.join(args.folder, f))] if args.all else [args.folder])
            for folder in folders:
                counts = check(folder)
                print(f"{folder}: ok, " + ", ".join(f"{KINDS[k].file} {n} rows" for k, n in counts.items()))
        elif args.command == "merge":
            summary = merge(args.new, args.data, keep_peers=args.keep_peers)
            for kind, (replaced, added, total) in summary.items():
                print(f"{KINDS[kind].file}: {replaced} rows replaced, {added} added, {total} in all")
            if not summary:
                print(f"{args.new}: no rows to merge")
        elif args.command == "stale":
            report = stale(args.folder, args.root)
            unknown = sorted(set(args.kinds or []) - {r for r in KINDS if KINDS[r].schema_kind == "results"})
            if unknown:
                raise DataError(f"--kinds: {', '.join(unknown)} carry no source_hash (the kinds: "
                                f"{', '.join(k for k in KINDS if KINDS[k].schema_kind == 'results')})")
            report = [r for r in report if not args.kinds or r["kind"] in args.kinds]
            total = {s: sum(r[s] for r in report) for s in ("rows", "current", "restamped", "stale")}
            behind = sorted({f"{r['kind']} {r['stage']}" for r in report if r["stale"]})
            if not args.brief:
                _print_table(report)
            print(f"{total['current'] + total['restamped']} of {total['rows']} rows of our stages are current: "
                  f"{total['current']} from this tree's code, {total['restamped']} restamped to it; "
                  f"{total['stale']} stale" + (f" ({'; '.join(behind)})" if behind else ""))
            if args.fail and total["stale"]:
                return 1
        elif args.command == "rewrite":
            for kind, n in rewrite(args.folder).items():
                print(f"{KINDS[kind].file}: {n} rows")
    except DataError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
