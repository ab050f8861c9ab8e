"""PyTorch on a GPU, imported only when asked for: loading it with a clear error, FP32 that is really
FP32, and CUDA-event timing. Shared by the torch runner and scripts/ceilings.py.
"""

from __future__ import annotations

import statistics
import time
import warnings
from typing import Callable, List, Tuple


class TorchUnavailable(RuntimeError):
    """PyTorch is not installed, too old, or sees no CUDA GPU."""


def load_torch(need_gpu: bool = True):
    """The torch module (with a CUDA GPU when `need_gpu`), or TorchUnavailable saying what is missing."""
    try:
        import torch
    except ImportError as error:
        raise TorchUnavailable(f"PyTorch is needed ({error}); install it on the GPU machine, e.g. "
                               f"`pip install torch` (CUDA build)") from None
    if need_gpu and not torch.cuda.is_available():
        raise TorchUnavailable(f"PyTorch {torch.__version__} sees no CUDA GPU (torch.version.cuda="
                               f"{torch.version.cuda})")
    return torch


def load_sdpa():
    """(torch, SDPBackend, sdpa_kernel): PyTorch 2.3 or newer on a GPU."""
    torch = load_torch()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as error:
        raise TorchUnavailable(f"PyTorch {torch.__version__} lacks torch.nn.attention.sdpa_kernel (2.3 or newer "
                               f"needed): {error}") from None
    return torch, SDPBackend, sdpa_kernel


TORCH_DTYPES = ("float32", "float16", "bfloat16")
PRECISION_OF_DTYPE = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def torch_dtype(torch, precision: str):
    """The torch dtype of a precision name ('fp32', 'fp16', 'bf16')."""
    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def precision_of(dtype) -> str:
    """'fp32', 'fp16' or 'bf16' for a torch dtype; KeyError for another."""
    return PRECISION_OF_DTYPE[str(dtype).replace("torch.", "")]


def disable_tf32(torch) -> None:
    """FP32 matmuls in true FP32, then proven so: TF32 rounds the inputs to 10 mantissa bits, which
    shows as a relative error near 1e-3 on a 512-long dot product; IEEE FP32 stays near 1e-6.
    TorchUnavailable when TF32 cannot be turned off."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        except (AttributeError, RuntimeError):  # only the newer per-backend API is left
            torch.backends.cuda.matmul.fp32_precision = "ieee"
            torch.backends.cudnn.fp32_precision = "ieee"
    generator = torch.Generator(device="cuda").manual_seed(1)
    a = torch.rand(512, 512, device="cuda", generator=generator) * 2 - 1
    b = torch.rand(512, 512, device="cuda", generator=generator) * 2 - 1
    exact = a.double() @ b.double()
    relative = ((a @ b).double() - exact).abs().max().item() / exact.abs().max().item()
    if relative > 1e-5:
        raise TorchUnavailable(f"FP32 matmul still rounds like TF32 (relative error {relative:.1e}); FP32 cannot "
                               f"be measured")


class GpuHold:
    """Keeps the GPU busy while the host submits a timed call. Events time the stream from `start` to
    `end`, so if the GPU reaches `start` before the host has launched the call, the host's Python,
    ctypes and dispatch time between them is timed too: tens of microseconds, most of a decoding
    call, and a few percent of a millisecond kernel, different for every caller. A spin kernel
    (torch.cuda._sleep) enqueued just before `start` and longer than the host's submission makes the
    GPU reach `start` only after the call is queued behind it: the events then bracket GPU work
    alone, as in a model whose host runs ahead of its GPU."""

    def __init__(self, torch):
        self.torch = torch
        torch.cuda._sleep(1000)  # its first launch loads the kernel
        cycles = 1_000_000
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        self.cycles_per_ms = cycles / max(start.elapsed_time(end), 1e-3)
        self.best_mhz = 0  # the highest SM clock read under load (rest_until_clock_recovers)

    def __call__(self, ms: float) -> None:
        self.torch.cuda._sleep(int(ms * self.cycles_per_ms))


HOLD_MIN_MS = 0.1  # the hold: three times the slowest submission seen, within these bounds
HOLD_MAX_MS = 2.0
_holds = {}


def gpu_hold(torch) -> GpuHold:
    """The process's GpuHold for the current device, calibrated once."""
    device = torch.cuda.current_device()
    if device not in _holds:
        _holds[device] = GpuHold(torch)
    return _holds[device]


REST_LIMIT_S = 1.0  # the longest rest before a timed series
REST_RECOVERED = 0.97  # of the highest SM clock read under load in this process
REST_WITHOUT_NVML_S = 0.1
REST_PROBE_MS = 5.0


def rest_until_clock_recovers(torch) -> None:
    """Rests the GPU before a timed series until its SM clock is back up. A heavy kernel (cuDNN's
    forward at D = 256, say) pulls an H100 to its power limit, and the clock stays down for a few
    hundred milliseconds after it (1980 MHz rested, 1260-1515 right after 0.9 s of cuDNN, 1740-1860
    after 0.1 s, 1965 after 0.3 s): a backend timed at once ran 8-25 % slower than rested, so
    whoever came after cuDNN in a row's order paid for cuDNN's power. The rest keeps the GPU busy with
    the hold's light spin kernel while NVML (torch.cuda.clock_rate) reads the clock under load, until
    it is within 3 % of the highest reading seen in this process, for at most a second. Without NVML
    (no pynvml) it is a fixed rest of 0.1 s."""
    hold = gpu_hold(torch)
    deadline = time.perf_counter() + REST_LIMIT_S
    while True:
        hold(REST_PROBE_MS)
        try:
            mhz = torch.cuda.clock_rate()
        except Exception:  # NVML missing or not answering
            torch.cuda.synchronize()
            time.sleep(REST_WITHOUT_NVML_S)
            return
        hold.best_mhz = max(hold.best_mhz, mhz)
        torch.cuda.synchronize()
        if mhz >= REST_RECOVERED * hold.best_mhz or time.perf_counter() > deadline:
            return


RELEASE_SETTLE_S_PER_GIB = 0.005  # twice the 2.5 ms per GiB measured on an H200 and an H100


def release_cached_memory(torch) -> float:
    """torch.cuda.empty_cache(), then a pause while the driver clears what it took back; the GiB
    released. The driver scrubs device memory given back with cudaFree in the background, and while
    it does, every memory-bound kernel runs slower. Measured (a decoding call that reads 268 MB, timed
    over and over right after releasing N GiB): 12 % slower on an H200, 17 % on an H100, our stage
    and cuDNN alike, for 2.2-2.4 ms after 1 GiB, 5 ms after 2, 10 ms after 4, 20 ms after 8 on both.
    The runner releases before each shape and times our stage first, within 10 ms at short decoding
    shapes: at B = 16, Nq = 1, Nk = 4096, after the B = 4, Nk = 262144 shape gave back about 8 GiB,
    it had measured 0.074 ms where the kernel takes 0.066. The pause is RELEASE_SETTLE_S_PER_GIB for
    each GiB released."""
    reserved = torch.cuda.memory_reserved()
    torch.cuda.empty_cache()
    released_gib = (reserved - torch.cuda.memory_reserved()) / 2**30
    time.sleep(released_gib * RELEASE_SETTLE_S_PER_GIB)
    return released_gib


def event_times_ms(torch, call: Callable[[], object], warmup: int, reps: int,
                   before_each: Callable[[], object] = None) -> List[float]:
    """Rests the GPU until its clock is up (rest_until_clock_recovers), runs `call` warmup times
    untimed, then reps times each between two CUDA events on the current stream: the list of
    milliseconds. `before_each` (e.g. an L2 flush) runs before every timed call, outside the events.
    A GpuHold before each start event keeps the host's submission time out of the events: three
    times the slowest submission seen so far (host clock), 0.1 to 2 ms."""
    hold = gpu_hold(torch)
    rest_until_clock_recovers(torch)
    submit_ms = 0.0
    for _ in range(warmup):
        started = time.perf_counter()
        call()
        submit_ms = max(submit_ms, (time.perf_counter() - started) * 1e3)
    times = []
    for _ in range(reps):
        if before_each is not None:
            before_each()
        hold(min(HOLD_MAX_MS, max(HOLD_MIN_MS, 3 * submit_ms)))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        started = time.perf_counter()
        call()
        submit_ms = max(submit_ms, (time.perf_counter() - started) * 1e3)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def median_min_ms(torch, call, warmup: int, reps: int, before_each=None) -> Tuple[float, float]:
    times = event_times_ms(torch, call, warmup, reps, before_each)
    return statistics.median(times), min(times)


def graph_replay(torch, call: Callable[[], object]) -> Callable[[], object]:
    """`call` captured once in a CUDA graph (after one call on a side stream, as PyTorch asks before a
    capture): a function that replays the graph and returns what `call` returned during the capture
    (its output tensors, which every replay rewrites). The way serving engines run a decoding step: one
    launch of the whole graph, no per-call host work."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call()

    def replay():
        graph.replay()
        return captured

    return replay


class L2Flush:
    """Evicts the L2 cache by reading a buffer twice its size (reads leave no dirty lines behind to be
    written back during the timed call). For inputs that would otherwise stay in L2 between calls
    (decoding shapes)."""

    def __init__(self, torch, l2_bytes: int = 0):
        properties = torch.cuda.get_device_properties(torch.cuda.current_device())
        l2_bytes = l2_bytes or getattr(properties, "L2_cache_size", 0) or 64 * 2**20
        self.bytes = 2 * int(l2_bytes)
        self._buffer = torch.empty(self.bytes // 4, dtype=torch.float32, device="cuda").fill_(1.0)
        self._sink = torch.empty((), dtype=torch.float32, device="cuda")

    def __call__(self):
        self._sink.copy_(self._buffer.sum())
