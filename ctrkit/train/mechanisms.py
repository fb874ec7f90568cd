"""The mechanisms a recipe may add to a published model, each named once, here, with the settings that toggle it.

The plan (``train/plan.py``) says which of them a run uses; ``ctrkit bench ablation`` switches each off alone
to measure what it earns (docs/decisions/ablation.md). A mechanism whose effect is read from the same run
(``derived``) needs no run of its own: the run scores its model with and without it (the uncalibrated logits,
the best single model beside an ensemble).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ctrkit.train.sources import Source, source


@dataclass(frozen=True)
class Mechanism:
    """One mechanism.

    Attributes:
        name: its name in the plan and the ablation table.
        summary: what it does, in a few words.
        toggle_train: TrainConfig fields that switch it from its state in the default recipe: off, or, for an
            ``opt_in`` mechanism, on (what the ablation runs to measure it).
        toggle_model: the same of the model config's fields.
        derived: the key of the run's test result that holds the model's scores without it (no run of its own).
        opt_in: off in the default recipe (``toggle_train`` and ``toggle_model`` turn it on).
    """

    name: str
    summary: str
    toggle_train: dict[str, Any] = field(default_factory=dict)
    toggle_model: dict[str, Any] = field(default_factory=dict)
    derived: str | None = None
    opt_in: bool = False


MECHANISMS: dict[str, Mechanism] = {
    m.name: m
    for m in (
        Mechanism("first_order", "a first-order (logistic) term beside the deep part", toggle_model={"linear": False}),
        Mechanism(
            "buckets",
            "quantile buckets of the numericals in the first-order term",
            toggle_model={"numerical_buckets": 16},
            opt_in=True,
        ),
        Mechanism(
            "warm_start",
            "start from a fitted logistic regression that the model must beat",
            toggle_train={"linear_warm_start": False},
        ),
        Mechanism(
            "warm_start_logloss",
            "a model is kept only when its log loss beats the regression's",
            toggle_train={"warm_start_logloss": True},
            opt_in=True,
        ),
        Mechanism(
            "redraws",
            "redraw the tables once a second pass over the data overfits",
            toggle_train={"reinit_embeddings": "off"},
        ),
        Mechanism("plateau", "halve the learning rates on a validation plateau", toggle_train={"plateau_patience": 0}),
        Mechanism(
            "decay",
            "polynomial decay over the last half of the planned steps",
            toggle_train={"decay_steps": None},
            opt_in=True,
        ),
        Mechanism(
            "small_batch",
            "on small data, also train at a smaller batch and keep the better",
            toggle_train={"small_batch": 0},
        ),
        Mechanism(
            "calibration",
            "temperature scaling of the kept model's logit",
            toggle_train={"calibrate": "off"},
            derived="uncalibrated",
        ),
        Mechanism(
            "ensembles",
            "keep a mean of snapshot or seed models where validation prefers it (N models a request)",
            toggle_train={"snapshot_ensemble": 3, "seed_ensemble": 3},
            opt_in=True,
        ),
    )  # fmt: skip
}


def mechanism(name: str) -> Mechanism:
    """The mechanism called ``name``; an unknown name is a ValueError listing the known."""
    if name not in MECHANISMS:
        raise ValueError(f"unknown mechanism '{name}'; known: {', '.join(MECHANISMS)}")
    return MECHANISMS[name]


CONTINUED_RATES = 0.5  # a continued run's dense and table rates left to the model: this share of its defaults
CONTINUED_WIDE_RATE = 4.0  # ... and its first-order rate: this multiple (no warm start fits the new ids' weights)
CONTINUED_HALF_LIFE = 2  # ... and its dynamic tables' counts: halving every this many epochs of the new data


def continued_settings(cfg: Any, sources: dict[str, Source], rules: dict[str, str], steps: int) -> dict[str, Any]:
    """What a run continued from a trained model (``--continue-from``) changes where the user left the setting to
    the model's default (recorded in ``rules`` for the plan), ``steps`` being the batches of an epoch: the dense
    and table rates at ``CONTINUED_RATES`` of it (a trained model is carried on, not trained anew), the
    first-order rate at ``CONTINUED_WIDE_RATE`` times it (the new day's ids have no warm start to fit their
    first-order weights), the dynamic tables' counts halving every ``CONTINUED_HALF_LIFE`` epochs (so that the
    ids frequent on earlier days give way to today's when a table is full), and no table redraws (its tables are
    what it keeps)."""
    changes: dict[str, Any] = {}

    def left(name: str) -> bool:
        return source(sources, name).left_to_defaults

    rates = (f"a continued run: {CONTINUED_RATES:g} x the model's default dense and table rates, "
             f"{CONTINUED_WIDE_RATE:g} x its first-order rate")  # fmt: skip
    for name, share in (("lr", CONTINUED_RATES), ("embedding_lr", CONTINUED_RATES), ("wide_lr", CONTINUED_WIDE_RATE)):
        if left(name):
            changes[name] = getattr(cfg, name) * share
            rules[name] = rates
    if left("count_half_life") and cfg.count_half_life == 0:
        changes["count_half_life"] = CONTINUED_HALF_LIFE * steps
        rules["count_half_life"] = f"a continued run: every {CONTINUED_HALF_LIFE} epochs of the new data"
    if left("reinit_embeddings"):
        changes["reinit_embeddings"] = "off"
        rules["reinit_embeddings"] = "a continued run keeps its tables"
    return changes
