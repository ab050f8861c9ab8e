#!/usr/bin/env python3
"""The device's measured ceilings, the roofs the stages are plotted under (design.md).

  fp32_sgemm_tf32_off   FP32 matmul 8192^3 with TF32 off (CUDA cores): the roof of stages 01-05
  fp16_tensor_matmul    FP16 matmul 8192^3, FP32 accumulation (tensor cores): stages 06-08
  bf16_tensor_matmul    BF16 likewise
  fp16_mma_sync, bf16_mma_sync
                        mma.sync.m16n8k16 alone, from registers (stage 08's instruction; measured by
                        the fa_mma_ceiling executable of stages/08_mma_registers, given --mma-ceiling)
  copy_bandwidth        device-to-device copy of 1 GiB, bytes read plus bytes written per second
  device_memory, l2_cache_bytes, smem_per_sm_bytes, multiprocessors: facts the notebooks and
                        scripts/traffic.py use (what the memory sweep runs into; the M of the
                        FlashAttention IO analysis)

Random inputs (not zeros: zeros can let the hardware and power management cheat), several
warm-up runs, then the median of timed runs (CUDA events). Writes ceilings.csv
(gpu, metric, value, unit), replacing an older one.

  python3 scripts/ceilings.py --out plots/data/<gpu>/ceilings.csv
"""

import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))

from fa_course import results, torch_gpu  # noqa: E402

PROGRAM = "ceilings"


def die(message):
    print(f"{PROGRAM}: {message}", file=sys.stderr)
    sys.exit(2)


def median_ms(torch, run, warmup, reps):
    return statistics.median(torch_gpu.event_times_ms(torch, run, warmup, reps))


def matmul_tflops(torch, dtype, size, warmup, reps):
    generator = torch.Generator(device="cuda").manual_seed(7)
    a = (torch.rand(size, size, device="cuda", generator=generator) * 2 - 1).to(dtype)
    b = (torch.rand(size, size, device="cuda", generator=generator) * 2 - 1).to(dtype)
    c = torch.empty(size, size, device="cuda", dtype=dtype)
    ms = median_ms(torch, lambda: torch.matmul(a, b, out=c), warmup, reps)
    return 2.0 * size**3 / (ms / 1e3) / 1e12


def copy_gbps(torch, megabytes, warmup, reps):
    elements = megabytes * 2**20 // 4
    source = torch.rand(elements, device="cuda")
    target = torch.empty_like(source)
    ms = median_ms(torch, lambda: target.copy_(source), warmup, reps)
    return 2.0 * elements * 4 / (ms / 1e3) / 1e9


def mma_sync_rows(binary):
    """Runs fa_mma_ceiling, which prints lines "metric,value,unit"."""
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
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()

    try:
        torch = torch_gpu.load_torch()
        torch_gpu.disable_tf32(torch)
    except torch_gpu.TorchUnavailable as error:
        die(str(error))
    gpu = torch.cuda.get_device_name(0)
    properties = torch.cuda.get_device_properties(0)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = args.out or os.path.join(root, "plots", "data", results.gpu_folder(gpu), "ceilings.csv")

    rows = [
        ("fp32_sgemm_tf32_off", matmul_tflops(torch, torch.float32, args.size, args.warmup, args.reps), "TFLOP/s"),
        ("fp16_tensor_matmul", matmul_tflops(torch, torch.float16, args.size, args.warmup, args.reps), "TFLOP/s"),
        ("bf16_tensor_matmul", matmul_tflops(torch, torch.bfloat16, args.size, args.warmup, args.reps), "TFLOP/s"),
    ]
    if args.mma_ceiling:
        rows += mma_sync_rows(args.mma_ceiling)
    rows += [
        ("copy_bandwidth", copy_gbps(torch, args.copy_mib, args.warmup, args.reps), "GB/s"),
        ("device_memory", properties.total_memory, "B"),
        ("multiprocessors", properties.multi_processor_count, "count"),
    ]
    # Newer PyTorch exposes these; the FlashAttention IO prediction needs the shared memory per SM.
    for attribute, metric in (("L2_cache_size", "l2_cache_bytes"),
                              ("shared_memory_per_multiprocessor", "smem_per_sm_bytes")):
        value = getattr(properties, attribute, None)
        if value:
            rows.append((metric, value, "B"))

    results.write_ceilings(out, [{"gpu": gpu, "metric": metric, "value": value, "unit": unit}
                                 for metric, value, unit in rows])
    print(f"{gpu}: ceilings written to {out}")
    for metric, value, unit in rows:
        print(f"  {metric:<22} {value:>14.6g} {unit}" if isinstance(value, float) else
              f"  {metric:<22} {value:>14} {unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
