"""The environment probe, run as a child of the suite: imports torch, DGL, PyG and dgl_oac, finds ogb, and
prints ONE JSON line, last (anything printed before it, such as DGL's first-import notice, is ignored by the
reader, ``gpu.probe.last_json``). Each import's failure is reported, not raised, so the line is always printed.

    python scripts/gpu/envprobe.py --device cuda
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import sys
import time
from typing import Any, Dict


def h2d_gbps(torch: Any) -> float:
    """Pinned host -> device copy bandwidth (GB/s), for the cost model."""
    src = torch.empty(256 << 20, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty_like(src, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    return 5 * src.numel() / (time.perf_counter() - t0) / 1e9


def facts(device: str) -> Dict[str, Any]:
    info: Dict[str, Any] = {"python": sys.version, "platform": platform.platform()}
    try:
        import torch

        cuda = torch.cuda.is_available()
        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda=cuda,
                    torch_threads=torch.get_num_threads())
        if cuda:
            props = torch.cuda.get_device_properties(0)
            info.update(gpu=props.name, gpu_count=torch.cuda.device_count(),
                        gpu_memory_gib=props.total_memory / 2**30, capability=f"{props.major}.{props.minor}",
                        cudnn=torch.backends.cudnn.version())
            if device.startswith("cuda"):
                info["h2d_gbps"] = h2d_gbps(torch)
    except Exception as exc:  # noqa: BLE001 - reported, the line must still be printed
        info["torch_error"] = repr(exc)
    for mod in ("dgl", "torch_geometric", "dgl_oac"):
        try:
            info[mod] = getattr(__import__(mod), "__version__", "imported")
        except Exception as exc:  # noqa: BLE001
            info[f"{mod}_error"] = repr(exc)[-1000:]
    try:  # not imported: ogb's import starts a non-daemon thread that asks the network if ogb is outdated
        info["ogb"] = importlib.metadata.version("ogb")
    except importlib.metadata.PackageNotFoundError as exc:
        info["ogb_error"] = repr(exc)
    return info


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu")
    print(json.dumps(facts(p.parse_args().device)), flush=True)


if __name__ == "__main__":
    main()
