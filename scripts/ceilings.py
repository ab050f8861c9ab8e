#!/usr/bin/env python3
"""The device's measured ceilings, the roofs the stages are plotted under (DESIGN.md).

  fp32_sgemm_tf32_off   FP32 matmul 8192^3 with TF32 off (CUDA cores): the roof of stages 01-05
  fp16_tensor_matmul    FP16 matmul 8192^3, FP32 accumulation (tensor cores): stages 06-08
  bf16_tensor_matmul    BF16 likewise
  fp8_tensor_matmul     e4m3 x e4m3 matmul 8192^3 through torch._scaled_mm (per-tensor FP32 scales,
                        BF16 out, fast accumulation: the wgmma accumulation stage 14's kernel uses,
                        without cuBLAS's periodic promotion): stage 14's roof
  fp16_mma_sync, bf16_mma_sync
                        mma.sync.m16n8k16 alone, from registers (stage 08's instruction; measured by
                        the fa_mma_ceiling executable of stages/08_mma_registers, given --mma-ceiling)
  copy_bandwidth        device-to-device copy of 1 GiB, bytes read plus bytes written per second
  read_bandwidth        a stream of reads alone, stage 12's K/V tiles with nothing computed (measured
                        by the fa_read_ceiling executable of stages/12_split_kv, given --read-ceiling):
                        the fastest any decoding kernel can read K and V
  device_memory, l2_cache_bytes, smem_per_sm_bytes, multiprocessors: facts the notebooks and
                        scripts/traffic.py use (what the memory sweep runs into; the M of the
                        FlashAttention IO analysis)

Random inputs (not zeros: zeros can let the hardware and power management cheat), several
warm-up runs, then the median of timed runs (CUDA events). Writes ceilings.csv
(gpu, metric, value, unit), replacing an older one; with --only, just the metrics named.

  python3 scripts/ceilings.py --out plots/data/<gpu>/ceilings.csv
  python3 scripts/ceilings.py --only read_bandwidth --read-ceiling build/bin/fa_read_ceiling --out DIR/ceilings.csv
"""

import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from fa_course.bench import results, torch_gpu  # noqa: E402

PROGRAM = "ceilings"


# Every metric this script can write: measured here, measured by an executable (named by its
# option), or a fact of the device.
MEASURED = ("fp32_sgemm_tf32_off", "fp16_tensor_matmul", "bf16_tensor_matmul", "fp8_tensor_matmul", "copy_bandwidth")
FROM_EXECUTABLES = {"fp16_mma_sync": "--mma-ceiling", "bf16_mma_sync": "--mma-ceiling",
                    "read_bandwidth": "--read-ceiling"}
FACTS = ("device_memory", "multiprocessors", "l2_cache_bytes", "smem_per_sm_bytes")


def die(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    sys.exit(2)


def chosen_metrics(only, given_options):
    """The metrics to write: all of them when `only` is empty, else the comma-separated names in it.
    `given_options` holds the executables' options given (--mma-ceiling, --read-ceiling); a metric
    whose executable is missing is left out of "all" and refused when named. Raises ValueError with
    the reason for a name it does not know or cannot measure, before anything touches the GPU."""
    available = list(MEASURED) + [m for m, option in FROM_EXECUTABLES.items() if option in given_options]
    available += list(FACTS)
    if not only:
        return set(available)
    names = {name.strip() for name in only.split(",") if name.strip()}
    unknown = sorted(names - set(MEASURED) - set(FROM_EXECUTABLES) - set(FACTS))
    if unknown:
        raise ValueError(f"--only: no metric {', '.join(unknown)} (these are: "
                         f"{', '.join(list(MEASURED) + list(FROM_EXECUTABLES) + list(FACTS))})")
    missing = sorted(name for name in names if name in FROM_EXECUTABLES and name not in available)
    if missing:
        raise ValueError(f"--only: {', '.join(f'{name} needs {FROM_EXECUTABLES[name]}' for name in missing)}")
    return names


def median_ms(torch, run, warmup, reps):
    return statistics.median(torch_gpu.event_times_ms(torch, run, warmup, reps))


def matmul_tflops(torch, dtype, size, warmup, reps):
    generator = torch.Generator(device="cuda").manual_seed(7)
    a = (torch.rand(size, size, device="cuda", generator=generator) * 2 - 1).to(dtype)
    b = (torch.rand(size, size, device="cuda", generator=generator) * 2 - 1).to(dtype)
    c = torch.empty(size, size, device="cuda", dtype=dtype)
    ms = median_ms(torch, lambda: torch.matmul(a, b, out=c), warmup, reps)
    return 2.0 * size**3 / (ms / 1e3) / 1e12


def fp8_matmul_tflops(torch, size, warmup, reps):
    """e4m3 x e4m3 -> BF16 through torch._scaled_mm: A row-major, B column-major (cuBLASLt's FP8 layout
    rule), per-tensor FP32 scales of 1, fast accumulation."""
    generator = torch.Generator(device="cuda").manual_seed(7)
    fp8 = torch.float8_e4m3fn
    a = (torch.rand(size, size, device="cuda", generator=generator) * 2 - 1).to(fp8)
    b = (torch.rand(size, size, device="cuda", generator=generator) * 2 - 1).to(fp8).t()  # column-major
    one = torch.ones((), device="cuda", dtype=torch.float32)

    def run():
        return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16, use_fast_accum=True)

    ms = median_ms(torch, run, warmup, reps)
    return 2.0 * size**3 / (ms / 1e3) / 1e12


def copy_gbps(torch, megabytes, warmup, reps):
    elements = megabytes * 2**20 // 4
    source = torch.rand(elements, device="cuda")
    target = torch.empty_like(source)
    ms = median_ms(torch, lambda: target.copy_(source), warmup, reps)
    return 2.0 * elements * 4 / (ms / 1e3) / 1e9


def executable_rows(binary):
    """Runs a ceiling executable (fa_mma_ceiling, fa_read_ceiling), which prints lines
    "metric,value,unit"."""
    try:
        done = subprocess.run([binary], capture_output=True, text=True, timeout=120, check=False)
    except OSError as error:
        die(f"cannot run {binary}: {error}")
    if done.returncode != 0:
        die(f"{binary} failed (exit {done.returncode}): {done.stderr.strip()}")
    rows = []
    for line in done.stdout.split():
        metric, value, unit = line.split(",")
        rows.append((metric, float(value), unit))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="CSV to write (default: plots/data/<gpu>/ceilings.csv)")
    parser.add_argument("--size", type=int, default=8192, help="matmul size n for n^3 (default: %(default)s)")
    parser.add_argument("--copy-mib", type=int, default=1024, help="copied buffer size (default: %(default)s)")
    parser.add_argument("--mma-ceiling", help="the fa_mma_ceiling executable (build/bin/fa_mma_ceiling); "
                                              "without it the mma.sync rows are left out")
    parser.add_argument("--read-ceiling", help="the fa_read_ceiling executable (build/bin/fa_read_ceiling); "
                                               "without it the read_bandwidth row is left out")
    parser.add_argument("--only", help="comma-separated metrics to measure, the others left out (to add one "
                                       "row to a data set with fa_course.bench.data merge)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    given = {option for option, value in (("--mma-ceiling", args.mma_ceiling), ("--read-ceiling", args.read_ceiling))
             if value}
    try:
        only = chosen_metrics(args.only, given)
    except ValueError as error:
        die(str(error))

    try:
        torch = torch_gpu.load_torch()
        torch_gpu.disable_tf32(torch)
    except torch_gpu.TorchUnavailable as error:
        die(str(error))
    gpu = torch.cuda.get_device_name(0)
    properties = torch.cuda.get_device_properties(0)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = args.out or os.path.join(root, "plots", "data", results.gpu_folder(gpu), "ceilings.csv")

    # Each measurement, by the metrics it yields; `only` picks some (chosen_metrics has left out the
    # executables not given; the facts cost nothing).
    def matmuls(metric, dtype):
        return lambda: [(metric, matmul_tflops(torch, dtype, args.size, args.warmup, args.reps), "TFLOP/s")]

    measurements = [
        (("fp32_sgemm_tf32_off",), matmuls("fp32_sgemm_tf32_off", torch.float32)),
        (("fp16_tensor_matmul",), matmuls("fp16_tensor_matmul", torch.float16)),
        (("bf16_tensor_matmul",), matmuls("bf16_tensor_matmul", torch.bfloat16)),
        (("fp8_tensor_matmul",), lambda: [("fp8_tensor_matmul", fp8_matmul_tflops(torch, args.size, args.warmup,
                                                                                  args.reps), "TFLOP/s")]),
        (("copy_bandwidth",), lambda: [("copy_bandwidth", copy_gbps(torch, args.copy_mib, args.warmup, args.reps),
                                        "GB/s")]),
        (("fp16_mma_sync", "bf16_mma_sync"), lambda: executable_rows(args.mma_ceiling)),
        (("read_bandwidth",), lambda: executable_rows(args.read_ceiling)),
    ]
    facts = [
        ("device_memory", properties.total_memory, "B"),
        ("multiprocessors", properties.multi_processor_count, "count"),
    ]
    # Newer PyTorch exposes these; the FlashAttention IO prediction needs the shared memory per SM.
    for attribute, metric in (("L2_cache_size", "l2_cache_bytes"),
                              ("shared_memory_per_multiprocessor", "smem_per_sm_bytes")):
        value = getattr(properties, attribute, None)
        if value:
            facts.append((metric, value, "B"))

    rows = [row for metrics, measure in measurements if only & set(metrics) for row in measure()]
    rows += [fact for fact in facts if fact[0] in only]

    results.write_ceilings(out, [{"gpu": gpu, "metric": metric, "value": value, "unit": unit}
                                 for metric, value, unit in rows])
    print(f"{gpu}: ceilings written to {out}")
    for metric, value, unit in rows:
        print(f"  {metric:<22} {value:>14.6g} {unit}" if isinstance(value, float) else
              f"  {metric:<22} {value:>14} {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
