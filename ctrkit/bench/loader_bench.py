"""The input pipeline alone: batches read from a split-binary dataset (``BatchLoader``: the shuffled batch order, the
files' rows gathered, the prefetch thread; on a GPU in the files' dtypes into pinned memory), and read and fed to
the device (``DeviceFeed``), as training reads them but with no model step; on a GPU also the wide batches copied
from pageable memory (the feed's predecessor). Samples a second, medians over interleaved rounds."""

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


def _read(loader, epoch: int, batches: int, device: torch.device | None, feed: bool) -> tuple[float, int]:
    """Seconds to read ``batches`` batches of ``epoch`` (and, with a ``device``, bring each there: through the
    ``DeviceFeed`` with ``feed``, else copied wide), and the samples read."""
    from ctrkit.data.device_feed import DeviceFeed

    samples = 0
    stream = loader.epoch(epoch)
    if device is not None and feed:
        stream = DeviceFeed(device)(stream)
    start = time.perf_counter()
    try:
        for k, batch in enumerate(stream):
            if k == batches:
                break
            if device is not None and not feed:
                batch = batch.to(device, non_blocking=True)
            samples += batch.labels.shape[0]
        if device is not None and device.type == "cuda":
            torch.cuda.synchronize(device)
    finally:
        stream.close()
    return time.perf_counter() - start, samples


def run_loader_bench(cfg: LoaderBenchConfig, device: torch.device) -> dict[str, Any]:
    """Samples a second of the loader alone, of the loader with each batch fed to ``device`` and, on a GPU, of the
    wide batches copied from pageable memory, per round and as medians."""
    from ctrkit.data.dataset import SplitBinaryDataset
    from ctrkit.data.device_feed import narrow_on
    from ctrkit.data.feature_spec import FeatureSpec
    from ctrkit.data.loader import BatchLoader

    if cfg.batch_size < 1 or cfg.batches < 1 or cfg.rounds < 1:
        raise ValueError("`batch_size`, `batches` and `rounds` must be at least 1")
    path = dataset_for(cfg)
    train = SplitBinaryDataset(FeatureSpec.from_yaml(path), "train")
    loader = BatchLoader(train, cfg.batch_size, shuffle=True, seed=0, narrow=narrow_on(device))  # as training's
    batches = min(cfg.batches, len(loader))
    modes = [("loader", loader, None, False), ("loader_and_copy", loader, device, True)]
    if narrow_on(device):
        wide = BatchLoader(train, cfg.batch_size, shuffle=True, seed=0)
        modes.append(("wide_pageable_copy", wide, device, False))
    rates: dict[str, list[float]] = {mode[0]: [] for mode in modes}
    read: dict[str, int] = {}
    for r in range(cfg.rounds):  # each measurement reads an epoch of its own; they take turns going first
        for k, (mode, source, to, feed) in enumerate(modes[r % len(modes) :] + modes[: r % len(modes)]):
            seconds, read[mode] = _read(source, len(modes) * r + k, batches, to, feed)
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
