"""A trained model's (or a dataset's) carried preprocessing, to write a later day with (``--like``): a table's
(``preprocess table --like``) or Criteo's (``preprocess criteo --like``, either engine). The day keeps the model's
columns, roles and readings; its vocabularies extend the model's (``vocabulary.extend``)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.preprocess.carried import Carried
from ctrkit.preprocess.criteo import CRITEO_SOURCE, CriteoRecipe
from ctrkit.preprocess.table_recipe import Derived, Roles, TableRecipe
from ctrkit.preprocess.transform import DERIVED_TEXTS, RowTransform, from_dataset


@dataclass(frozen=True)
class Like:
    """A trained model's (or a dataset's) carried preprocessing, to write a later day's table with
    (``preprocess table --like``): its columns, roles, types and vocabularies, extended by the values it has not
    seen; ``fingerprint`` is its vocabularies' (``integrity.vocabulary_fingerprint``; empty where every column is
    a raw id), ``extends`` those that one extends in turn, ``cardinalities`` its features' table rows (a raw-id
    feature keeps its table's), ``combiners`` its multi-hot features' pooling."""

    transform: RowTransform
    fingerprint: str
    extends: tuple[str, ...]
    cardinalities: dict[str, int]
    where: str
    combiners: dict[str, str] = field(default_factory=dict)

    def recipe(self, asked: TableRecipe) -> TableRecipe:
        """``asked`` (the label, its rule, the order, the split, the frequency threshold, bad rows) with the
        columns' roles and readings the model's: other role flags are refused."""
        t = self.transform
        if t.source != "ctrkit preprocess table" or t.rare_values != "rare":
            raise ValueError(f"{self.where}: carries the preprocessing of `{t.source}`"
                             + ("" if t.rare_values == "rare" else " without its rare values")
                             + "; --like extends a `ctrkit preprocess table` model's whole vocabularies")  # fmt: skip
        given = [f"--{k.replace('_', '-')}" for k in ("categorical", "numerical", "multi_hot", "drop", "raw_ids")
                 if getattr(asked, k)] + (["--capacity"] if asked.capacity is not None else [])  # fmt: skip
        if given:
            raise ValueError(f"{', '.join(given)}: with --like the columns' roles are {self.where}'s; leave them out")
        separators = {f.separator for f in t.multi_hot}
        return replace(
            asked, also_categorical=(), null_values=t.null_values, raw_ids=tuple(
                f.feature for f in t.categorical if f.ids == "xxh64"),
            separator=separators.pop() if separators else asked.separator,
        )  # fmt: skip

    def criteo_recipe(self, asked: CriteoRecipe) -> CriteoRecipe:
        """``asked`` (its frequency threshold) with the model's raw-id columns: refused where the model was not made
        from Criteo days."""
        t = self.transform
        if t.source != CRITEO_SOURCE:
            raise ValueError(f"{self.where}: carries the preprocessing of `{t.source}`; `preprocess criteo --like` "
                             "takes a model made from Criteo days (a table's: `preprocess table --like`)")  # fmt: skip
        return replace(asked, raw_ids=tuple(f.column for f in t.categorical if f.ids == "hex_key"))

    @classmethod
    def of(cls, transform: Carried | None, summary: dict, where: str, combiners: Sequence[str] | None = None
           ) -> Like:  # fmt: skip
        """The ``Like`` of a model or dataset: its carried ``transform``, its feature spec's ``summary`` and its
        multi-hot features' pooling (a model's ``combiners``; a dataset's are its spec's)."""
        if transform is None:
            raise ValueError(f"--like {where}: carries no preprocessing record (made by `ctrkit preprocess table` of "
                             "this version)")  # fmt: skip
        if not isinstance(transform, RowTransform):
            raise ValueError(f"--like {where}: carries the preprocessing of `{transform.source}`, which a later day "
                             "cannot extend; `--like` takes a model made by `preprocess table` or `preprocess criteo`"
                             )  # fmt: skip
        rows = dict(zip(summary.get("categorical_features", []), summary.get("cardinalities", [])))
        rows.update(zip(summary.get("multi_hot_features", []), summary.get("multi_hot_cardinalities", [])))
        multi = summary.get("multi_hot_features", [])
        pooled = dict(zip(multi, combiners if combiners is not None else summary.get("multi_hot_combiners", [])))
        return cls(transform, str(summary.get("vocabulary") or ""), tuple(summary.get("extends", [])), rows, where,
                   pooled)  # fmt: skip

    @classmethod
    def of_dataset(cls, directory: str | os.PathLike) -> Like:
        """The ``Like`` of a dataset directory written by ``preprocess table``."""
        return cls.of(from_dataset(directory), FeatureSpec.from_yaml(Path(directory)).summary(), str(directory))

    def roles(self) -> Roles:
        t = self.transform
        derived = tuple(Derived(f.feature, f.column, f.text, f.time_format) for f in t.categorical
                        if f.text in DERIVED_TEXTS)  # fmt: skip
        return Roles(tuple(f.feature for f in t.categorical), tuple(f.feature for f in t.numerical),
                     tuple(f.feature for f in t.multi_hot), derived)  # fmt: skip
