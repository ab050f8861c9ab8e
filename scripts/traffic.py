#!/usr/bin/env python3
"""Measured DRAM and L2 traffic of each GPU stage, beside what the FlashAttention paper predicts.

Runs every stage executable once under Nsight Compute,

  ncu --clock-control none --metrics dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum
      build/bin/NN_name --batch B --heads H --seq N --dim D --reps 0 --warmup 0 --no-check --csv ROW  (exactly one forward)

sums the metrics over the stage's kernels and writes traffic.csv (design.md: stage, gpu, B, H, N,
D, dtype, dram_read_bytes, dram_write_bytes, l2_bytes, predicted_bytes); dtype and gpu come
from the row the stage itself writes. The default shapes are two of the seed001 table, (4, 16,
4096, 128) and (1, 16, 16384, 128), so the timing of the same shapes (compare_torch.py --shapes
seed001) gives the achieved FLOP/s for the roofline: at both, the K and V of all heads (64 MiB
and more in FP16) are larger than an H100's 50 MB L2.

predicted_bytes follows the IO analysis of the FlashAttention paper (Dao et al. 2022), with the
constants of its algorithms, per head, e = bytes per element, M = shared memory per SM in
elements (the `M` of the paper):
  standard attention (stage 02; Algorithm 0):   e * (4*N*d + 4*N^2)
      read Q, K; write S; read S, write P; read P, V; write O: Theta(N*d + N^2)
  FlashAttention (stages 04 and later):        e * (2*N*d + ceil(N/Br) * 2*N*d)
      Q read and O written once; K and V once per block of Br = min(ceil(M/(4d)), d) query rows,
      so about 8*N^2*d^2/M: Theta(N^2 d^2 / M)
  three passes over K (stage 03):              e * (2*N*d + ceil(N/Br) * 4*N*d)
      K read three times (max; sum; output) and V once per query block
The prediction counts DRAM traffic without any help from L2; the measured bytes show how much
the L2 cache saves when blocks that share K and V run at the same time.

  python3 scripts/traffic.py --bin build/bin --out plots/data/<gpu>/traffic.csv
"""

import argparse
import csv
import ctypes
import glob
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

METRICS = ["dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum"]
HEADER = ["stage", "gpu", "B", "H", "N", "D", "dtype", "dram_read_bytes", "dram_write_bytes", "l2_bytes",
          "predicted_bytes"]
ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
BYTE_UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12,
              "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "B": 1}
# How many times each query block streams K and V (see the docstring): stage number -> K+V reads.
KV_PASSES = {3: 4}
STANDARD_ATTENTION_STAGES = {2}
CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81


def die(message):
    print(f"traffic: {message}", file=sys.stderr)
    sys.exit(2)


def find_ncu(explicit):
    if explicit:
        return explicit
    candidates = [shutil.which("ncu")] + sorted(glob.glob("/usr/local/cuda*/bin/ncu"), reverse=True) + \
        sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu"), reverse=True)
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    die("Nsight Compute (ncu) not found: install it (nsight-compute) or pass --ncu PATH")


def shared_memory_per_sm():
    """Bytes of shared memory per SM of device 0, from the driver (no PyTorch needed)."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        die(f"no NVIDIA driver (libcuda.so.1): {error}")
    device, value = ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), 0) != 0:
        die("the driver finds no CUDA device")
    if cuda.cuDeviceGetAttribute(ctypes.byref(value), CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
                                 device) != 0:
        die("cannot read the shared memory per SM; pass --smem-per-sm BYTES")
    return value.value


def predicted_bytes(stage, shape, element_bytes, smem_per_sm):
    batch, heads, seq, dim = shape
    number = int(stage.split("_")[0])
    if number in STANDARD_ATTENTION_STAGES:
        per_head = 4 * seq * dim + 4 * seq * seq
    else:
        m_elements = smem_per_sm // element_bytes
        block_rows = min(math.ceil(m_elements / (4 * dim)), dim)
        passes = KV_PASSES.get(number, 2)
        per_head = 2 * seq * dim + math.ceil(seq / block_rows) * passes * seq * dim
    return batch * heads * per_head * element_bytes


def parse_ncu_csv(text, exclude):
    """Per-kernel metrics from `ncu --import R --csv --print-units base`. The details page has one
    row per (launch, metric) with "Metric Name", "Metric Unit", "Metric Value"; the raw page one
    row per launch with a column per metric (and a units row). Returns ({metric: total bytes},
    [(kernel, {metric: bytes})]) over the launches whose kernel name `exclude` does not match."""
    rows = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    if not rows:
        return None, []
    header = rows[0]
    launches = {}  # launch ID -> (kernel, {metric: bytes})

    def add(launch, kernel, metric, unit, value):
        unit = unit.strip() or "byte"
        if unit not in BYTE_UNITS:
            die(f"unexpected unit '{unit}' for {metric}")
        values = launches.setdefault(launch, (kernel, {}))[1]
        values[metric] = float(value.replace(",", "")) * BYTE_UNITS[unit]

    kernel_column, id_column = header.index("Kernel Name"), header.index("ID")
    if "Metric Name" in header:
        name, unit, value = (header.index(c) for c in ("Metric Name", "Metric Unit", "Metric Value"))
        for row in rows[1:]:
            if row[name] in METRICS:
                add(row[id_column], row[kernel_column], row[name], row[unit], row[value])
    else:
        columns = {m: header.index(m) for m in METRICS if m in header}
        units = rows[1] if len(rows) > 1 and not rows[1][id_column].strip() else [""] * len(header)
        for row in rows[1:]:
            if row[id_column].strip():
                for metric, column in columns.items():
                    add(row[id_column], row[kernel_column], metric, units[column], row[column])
    kernels = []
    for kernel, values in launches.values():
        if exclude and re.search(exclude, kernel):
            print(f"      left out (--exclude-kernels): {kernel[:90]}")
        else:
            kernels.append((kernel, values))
    for kernel, values in kernels:
        missing = [m for m in METRICS if m not in values]
        if missing:
            die(f"ncu reported no {', '.join(missing)} for {kernel}")
    totals = {m: sum(values[m] for _, values in kernels) for m in METRICS}
    return totals, kernels


def profile(ncu, executable, shape, timeout, exclude, workdir):
    """Runs one stage under ncu; returns (harness row, totals, kernels) or None (printed why)."""
    batch, heads, seq, dim = shape
    name = os.path.basename(executable)
    report = os.path.join(workdir, f"{name}_{seq}")
    row_csv = os.path.join(workdir, f"{name}_{seq}.csv")
    command = [ncu, "--clock-control", "none", "--metrics", ",".join(METRICS), "--target-processes", "all",
               "--force-overwrite", "--export", report, executable, "--batch", str(batch), "--heads", str(heads),
               "--seq", str(seq), "--dim", str(dim), "--reps", "0", "--warmup", "0", "--no-check",
               "--csv", row_csv]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"  {name} N={seq}: skipped, over {timeout} s under ncu")
        return None
    output = result.stdout + result.stderr
    if "ERR_NVGPUCTRPERM" in output:
        die("no permission for GPU performance counters (ERR_NVGPUCTRPERM): run as root or allow profiling")
    if result.returncode != 0 or not os.path.exists(report + ".ncu-rep"):
        print(f"  {name} N={seq}: failed (exit {result.returncode}):\n" + "\n".join(output.splitlines()[-15:]))
        return None
    imported = subprocess.run([ncu, "--import", report + ".ncu-rep", "--csv", "--print-units", "base"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    totals, kernels = parse_ncu_csv(imported.stdout, exclude)
    if not kernels:
        print(f"  {name} N={seq}: ncu profiled no kernel:\n" + "\n".join(output.splitlines()[-15:]))
        return None
    with open(row_csv, newline="") as handle:
        rows = list(csv.DictReader(handle, skipinitialspace=True))
    if not rows:
        print(f"  {name} N={seq}: the stage wrote no CSV row")
        return None
    return rows[-1], totals, kernels


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", default="build/bin", help="folder of the stage executables (default: %(default)s)")
    parser.add_argument("--out", required=True, help="traffic CSV to write (replaced)")
    parser.add_argument("--stages", help="comma-separated stage ids or numbers (default: every GPU stage found)")
    parser.add_argument("--shapes", default="4x16x4096x128,1x16x16384x128",
                        help="comma-separated BxHxNxD (default: %(default)s)")
    parser.add_argument("--ncu", help="path of ncu (default: found on PATH or under /usr/local/cuda*)")
    parser.add_argument("--smem-per-sm", type=int, help="bytes of shared memory per SM (default: asked of the driver)")
    parser.add_argument("--exclude-kernels", default="",
                        help="regex of kernel names that are not the stage's (harness kernels), left out of the sums")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per profiled run (default: %(default)s)")
    parser.add_argument("--max-seconds", type=float, default=480, help="stop after this long (default: %(default)s)")
    args = parser.parse_args()

    shapes = []
    for item in args.shapes.split(","):
        if not re.fullmatch(r"\d+x\d+x\d+x\d+", item.strip()):
            die(f"bad shape '{item}': use BxHxNxD")
        shapes.append(tuple(int(x) for x in item.strip().split("x")))
    executables = sorted(p for p in glob.glob(os.path.join(args.bin, "[0-9][0-9]_*")) if os.access(p, os.X_OK))
    executables = [p for p in executables if not os.path.basename(p).endswith("_cpu")]
    if args.stages:
        wanted = [s.strip() for s in args.stages.split(",")]
        executables = [p for p in executables
                       if os.path.basename(p) in wanted or os.path.basename(p)[:2] in [w.zfill(2) for w in wanted]]
    if not executables:
        die(f"no GPU stage executables in {args.bin}")
    ncu = find_ncu(args.ncu)
    smem = args.smem_per_sm or shared_memory_per_sm()
    print(f"ncu: {ncu}; shared memory per SM: {smem} bytes; stages: "
          f"{', '.join(os.path.basename(p) for p in executables)}")

    started = time.monotonic()
    written, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="fa_traffic_") as workdir:
        for shape in shapes:
            for executable in executables:
                stage = os.path.basename(executable)
                if time.monotonic() - started > args.max_seconds:
                    skipped.append(f"{stage} {shape}: past --max-seconds {args.max_seconds}")
                    continue
                result = profile(ncu, executable, shape, args.timeout, args.exclude_kernels, workdir)
                if result is None:
                    skipped.append(f"{stage} {shape}: see above")
                    continue
                row, totals, kernels = result
                if row.get("status", "ok") != "ok":
                    skipped.append(f"{stage} {shape}: the stage reported {row.get('status')}: {row.get('note')}")
                    continue
                dtype = row["dtype"]
                predicted = predicted_bytes(stage, shape, ELEMENT_BYTES[dtype], smem)
                written.append([stage, row["gpu"], *shape, dtype, int(totals[METRICS[0]]), int(totals[METRICS[1]]),
                                int(totals[METRICS[2]]), predicted])
                dram = totals[METRICS[0]] + totals[METRICS[1]]
                print(f"  {stage:<22} B={shape[0]} H={shape[1]} N={shape[2]} D={shape[3]} {dtype}: "
                      f"DRAM {dram / 1e9:.3f} GB (predicted {predicted / 1e9:.3f} GB), L2 "
                      f"{totals[METRICS[2]] / 1e9:.3f} GB over {len(kernels)} kernel(s)", flush=True)
                for kernel, values in kernels:
                    print(f"      {kernel[:90]}: DRAM read {values[METRICS[0]] / 1e9:.3f} GB, "
                          f"write {values[METRICS[1]] / 1e9:.3f} GB")

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(HEADER)
        writer.writerows(written)
    print(f"{len(written)} rows written to {args.out} in {time.monotonic() - started:.0f} s")
    for line in skipped:
        print(f"  skipped: {line}")
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
