"""The input pipeline alone: batches read from a split-binary dataset (``BatchLoader``: the shuffled batch order, the
files' rows gathered, the prefetch thread), and read and copied to the device, as training reads them but with no
model step. Samples a second, medians over interleaved rounds."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch

from ctrkit.bench.config import LoaderBenchConfig


def dataset_for(cfg: LoaderBenchConfig) -> Path:
    """The dataset to read: ``cfg.dataset``, else a synthetic one made once in ``cfg.work``."""
    if cfg.dataset is not None:
        return cfg.dataset
    from ctrkit.data.synthetic import CRITEO_1TB_FL15_CARDINALITIES, generate_dataset

    out = cfg.work / f"synth_{cfg.rows}"
    if not (out / "feature_spec.yaml").exists():
        generate_dataset(out, cfg.rows, cfg.tables or CRITEO_1TB_FL15_CARDINALITIES, 13, 0.01, 0, progress=False)
    return out


def _read(loader, epoch: int, batches: int, device: torch.device | None) -> tuple[float, int]:
    """Seconds to read ``batches`` batches of ``epoch`` (and copy each to ``device``), and the samples read."""
    samples = 0
    stream = loader.epoch(epoch)
    start = time.perf_counter()
    try:
        for k, batch in enumerate(stream):
            if k == batches:
                break
            if device is not None:
                batch = batch.to(device, non_blocking=True)
            samples += batch.labels.shape[0]
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        stream.close()
    return time.perf_counter() - start, samples


def run_loader_bench(cfg: LoaderBenchConfig, device: torch.device) -> dict[str, Any]:
    """Samples a second of the loader alone and of the loader with each batch copied to ``device``, per round and
    as medians."""
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.feature_spec import FeatureSpec
    from ctrkit.data.loader import BatchLoader

    if cfg.batch_size < 1 or cfg.batches < 1 or cfg.rounds < 1:
        raise ValueError("`batch_size`, `batches` and `rounds` must be at least 1")
    path = dataset_for(cfg)
    train = SplitBinaryDataset(FeatureSpec.from_yaml(path), "train")
    loader = BatchLoader(train, cfg.batch_size, shuffle=True, seed=0)
    batches = min(cfg.batches, len(loader))
    rates: dict[str, list[float]] = {"loader": [], "loader_and_copy": []}
    read: dict[str, int] = {}
    modes = [("loader", None), ("loader_and_copy", device)]
    for r in range(cfg.rounds):  # each measurement reads an epoch of its own; the two take turns going first
        for k, (mode, to) in enumerate(modes if r % 2 == 0 else modes[::-1]):
            seconds, read[mode] = _read(loader, 2 * r + k, batches, to)
            rates[mode].append(read[mode] / seconds)
    return {
        "dataset": str(path),
        "batch_size": cfg.batch_size,
        "batches": batches,
        "rounds": cfg.rounds,
        "device": str(device),
        "samples": read,
        "samples_per_s": rates,
        "median_samples_per_s": {mode: statistics.median(v) for mode, v in rates.items()},
    }
