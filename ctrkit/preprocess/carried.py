"""The preprocessing a model carries, of any source, read back from where it is kept: a dataset directory (what
``preprocess`` wrote beside the data), a checkpoint (``to_state``) or an export's version directory (``write``).

A table's and Criteo's days are ``transform.RowTransform`` (a rule per raw column); Outbrain's is
``outbrain_transform.OutbrainTransform`` (a display event and an ad looked up in the other files' tables). Both
answer the scorers' calls (``RawColumns``' column rule, ``from_request``, ``raw_rows``, ``check_tables``), and the
record's ``source`` says which one reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ctrkit.preprocess.outbrain_transform import SOURCE as OUTBRAIN_SOURCE
from ctrkit.preprocess.outbrain_transform import TABLES_FILE, OutbrainTransform
from ctrkit.preprocess.transform import RECORD_FILE, RowTransform
from ctrkit.preprocess.transform import from_dataset as table_from_dataset

Carried = RowTransform | OutbrainTransform


def _source(directory: Path) -> str | None:
    try:
        return json.loads((directory / RECORD_FILE).read_text(encoding="utf-8")).get("source")
    except (OSError, ValueError, AttributeError) as e:
        raise ValueError(f"{directory / RECORD_FILE}: not a preprocessing record ctrkit can read ({e})") from None


def from_state(state: Mapping[str, Any]) -> Carried:
    """The preprocessing a checkpoint carries (its ``to_state``)."""
    if state["description"].get("source") == OUTBRAIN_SOURCE:
        return OutbrainTransform.from_state(state)
    return RowTransform.from_state(state)


def files(directory: str | os.PathLike) -> list[str]:
    """The files of the preprocessing ``write`` wrote into ``directory`` (an export's version)."""
    directory = Path(directory)
    if _source(directory) == OUTBRAIN_SOURCE:
        return [RECORD_FILE, TABLES_FILE]
    return [RECORD_FILE, "vocabularies.parquet"]


def read(directory: str | os.PathLike) -> Carried:
    """The preprocessing ``write`` wrote into ``directory`` (an export's version)."""
    directory = Path(directory)
    if _source(directory) == OUTBRAIN_SOURCE:
        return OutbrainTransform.read(directory)
    return RowTransform.read(directory)


def from_dataset(directory: str | os.PathLike) -> Carried | None:
    """The preprocessing that made the dataset in ``directory``, or None where it has no record (synthetic data, a
    dataset written by NVIDIA's tools or by an older ctrkit)."""
    directory = Path(directory)
    if not (directory / RECORD_FILE).is_file():
        return None
    if _source(directory) == OUTBRAIN_SOURCE:
        return OutbrainTransform.read(directory)
    return table_from_dataset(directory)
