"""What the kernel files share: which path runs (``use_triton``), index uploads, and bench() timing.

A module of its own so that the kernel files import it, never their package (``kvarena.gpu.kernels`` imports
them back in ``use_interpreter``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

Path = str  # "auto" | "torch" | "triton"


def interpreted(kernel: object) -> bool:
    """Whether ``kernel`` was decorated under ``TRITON_INTERPRET=1`` (then it runs on CPU tensors)."""
    return type(kernel).__name__ == "InterpretedFunction"


def use_triton(kernel: object, tensor: torch.Tensor, path: Path = "auto") -> bool:
    if path == "torch" or tensor.is_meta:  # meta tensors (the no-read proof) run the torch ops on shapes only
        return False
    if path == "triton":
        if not (tensor.is_cuda or interpreted(kernel)):
            raise RuntimeError("the Triton path needs a CUDA tensor or TRITON_INTERPRET=1 set before import")
        return True
    if path != "auto":
        raise ValueError(f"path must be 'auto', 'torch' or 'triton', got {path!r}")
    return tensor.is_cuda or interpreted(kernel)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def as_index(values: object, device: torch.device) -> torch.Tensor:
    """Host ints (or a tensor) as an int64 tensor on ``device``."""
    if isinstance(values, torch.Tensor):
        return values.to(device=device, dtype=torch.int64)
    return torch.tensor(list(values), dtype=torch.int64, device=device)  # type: ignore[call-overload]


# ---------------------------------------------------------------------------------------------
# Timing for bench(): device events on CUDA (CUDA-graph replay for launches shorter than their own
# host overhead), a wall clock on CPU (dry runs only: never a GPU number).


def device_time(fn: Callable[[], object], device: torch.device, *, reps: int = 50, warmup: int = 5,
                graph_launches: int = 0) -> float:
    """Median seconds of one ``fn()`` after ``warmup`` calls.

    On CUDA each sample is timed with events. With ``graph_launches > 0`` a sample is one replay of a CUDA
    graph holding that many calls, divided by it: a Triton launch costs more host time than a tiny kernel
    runs, so events around a single eager launch would time the host, not the device.
    """
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples)
    torch.cuda.synchronize(device)
    per = 1
    run: Callable[[], object] = fn
    if graph_launches:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # warm the side stream as CUDA-graph capture requires
            fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(graph_launches):
                fn()
        run, per = graph.replay, graph_launches
        run()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / per)
    return statistics.median(samples)
