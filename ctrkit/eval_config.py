"""Typed, frozen configuration of the commands that read a checkpoint: evaluate and predict, report, and
convert-checkpoint; the flags are generated from these dataclasses as from ``config.py``'s."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ctrkit.config import BAD_VALUES, option
from ctrkit.field_types import Range, check_ranges


@dataclass(frozen=True)
class EvalConfig:
    """How a checkpoint is scored on a dataset mapping (``json`` is evaluate's, ``out`` predict's)."""

    checkpoint: Path | None = option(None, "checkpoint written by `ctrkit train`", required=True)
    dataset: Path | None = option(None, "dataset directory holding feature_spec.yaml", required=True)
    out: Path | None = option(
        None, "output file: NumPy .npy format, written at exactly this path", required=True, writes="file"
    )
    json: bool = option(False, "print one JSON object instead of a text line")
    device: str = option("auto", "auto, cpu, cuda, cuda:N")
    mapping: str = option("test", "source_spec mapping to score")
    batch_size: int = option(16384, "samples per forward pass", bounds=Range(1, 2**31 - 1))
    allow_other_vocabulary: bool = option(
        False,
        "score a dataset preprocessed with other vocabularies than the checkpoint's training data (refused by "
        "default: the same id means another value there, so the scores and metrics mean nothing)",
    )
    amp: bool = option(
        False,
        "score under autocast: bf16 (CPU with native bf16; CUDA with bf16 tensor cores) or fp16 (older GPUs); on CUDA "
        "only from 32,768 samples per process a batch (fp32 below, where autocast runs slower)",
    )
    no_progress: bool = option(False, "no progress bar")

    def validate(self) -> None:
        check_ranges(self)


@dataclass(frozen=True)
class PredictConfig:
    """``ctrkit predict``: a dataset mapping to a .npy file, or a file of raw rows to a table of scores."""

    checkpoint: Path | None = option(None, "checkpoint written by `ctrkit train`", required=True)
    dataset: Path | None = option(
        None, "dataset directory holding feature_spec.yaml: score its --mapping into a .npy file", exclusive="source",
        required=True,
    )  # fmt: skip
    input: Path | None = option(
        None,
        "a CSV (with a header) or Parquet file of raw rows, as the training table held them (the label column may be "
        "left out): each row goes through the preprocessing the checkpoint carries",
        exclusive="source",
        required=True,
    )
    out: Path | None = option(
        None,
        "output file: with --dataset, NumPy .npy at exactly this path; with --input, a table (.csv, or .parquet/.pq) "
        "of the --keep columns and 'probability', one row per input row",
        required=True,
        writes="file",
    )
    keep: tuple[str, ...] = option(
        (), "with --input: columns of the input copied to the output (ids)", parse="name_list"
    )
    missing_columns: str = option(
        "error",
        "with --input: a column the model reads, left out of the file: error (refused, naming it) or missing (missing "
        "in every row); columns the model does not read are ignored. ctrkit serve follows the same rule",
        ("error", "missing"),
    )
    bad_values: str = option(
        "error",
        "with --input: a value preprocessing refuses (text in a numerical column, a number beyond float32, a "
        "timestamp not of the column's format): error (refused, naming its line and column) or missing (scored as "
        "missing, counted in the summary). ctrkit serve follows the same rule",
        BAD_VALUES,
    )
    separator: str = option(",", "with --input: the CSV field separator: one byte, or 'tab' (or '\\t') for a tab")
    device: str = option("auto", "auto, cpu, cuda, cuda:N")
    mapping: str = option("test", "with --dataset: the source_spec mapping to score")
    batch_size: int = option(
        16384, "with --dataset: samples per forward pass; with --input: rows per block", bounds=Range(1, 2**31 - 1)
    )
    allow_other_vocabulary: bool = option(
        False,
        "with --dataset: score a dataset preprocessed with other vocabularies than the checkpoint's training data",
    )
    no_progress: bool = option(False, "no progress bar")

    def validate(self) -> None:
        check_ranges(self)
        if self.keep and self.input is None:
            raise ValueError("`keep` applies to --input (a .npy file of a dataset holds the probabilities alone)")
        from ctrkit.preprocess.table_reader import separator_char

        separator_char(self.separator, "`separator`")


@dataclass(frozen=True)
class ReportConfig:
    """``ctrkit report``: what the page is about and where it goes (the checkpoint is positional)."""

    out: Path = option(Path("report.html"), "the HTML file to write (self-contained: images embedded)", writes="file")
    dataset: Path | None = option(None, "dataset directory", unset="the run's, from the YAML beside the checkpoint")
    mapping: str = option("test", "source_spec mapping to score for the final metrics and the calibration")
    log_path: Path | None = option(None, "the run's JSON-lines log", unset="the run's --log-path, if it had one")
    device: str = option("auto", "auto, cpu, cuda, cuda:N")
    no_progress: bool = option(False, "no progress bar")


@dataclass(frozen=True)
class ConvertConfig:
    """``ctrkit convert-checkpoint``: a checkpoint between the one-file and the sharded forms."""

    checkpoint: Path | None = option(None, "checkpoint written by `ctrkit train` (sharded or not)", required=True)
    out: Path | None = option(None, "the checkpoint to write", required=True, writes="file")
    world_size: int | None = option(
        None,
        "write the sharded form a run of this many ranks writes (a manifest and a file per rank, tables placed by "
        "--sharding and its size options), without optimizer state",
        unset="one file with whole tables",
        bounds=Range(1, 65536),
    )
    overwrite: bool = option(False, "replace an existing output file")
