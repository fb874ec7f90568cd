"""Config checks shared by the model families (each raises ValueError naming the field)."""

from __future__ import annotations

from collections.abc import Sequence


def check_inputs(num_numerical: int, cardinalities: Sequence[int], embedding_dim: int) -> None:
    """The dataset-derived fields every model config has."""
    if num_numerical < 0:
        raise ValueError(f"num_numerical must be >= 0, got {num_numerical}")
    if not cardinalities or any(int(c) < 1 for c in cardinalities):
        raise ValueError(f"cardinalities must be a non-empty list of positive integers, got {list(cardinalities)}")
    if embedding_dim < 1:
        raise ValueError(f"embedding_dim must be positive, got {embedding_dim}")


def check_bottom_top(num_numerical: int, embedding_dim: int, bottom_mlp: Sequence[int], top_mlp: Sequence[int]) -> None:
    """A bottom MLP that ends in the embedding width (when there are numerical features) and a top MLP
    that ends in one logit."""
    if num_numerical and (not bottom_mlp or bottom_mlp[-1] != embedding_dim):
        raise ValueError(
            f"bottom_mlp must end in embedding_dim={embedding_dim} so its output can interact with the "
            f"embeddings, got {list(bottom_mlp)}"
        )
    if not top_mlp or top_mlp[-1] != 1:
        raise ValueError(f"top_mlp must end in 1 (the logit), got {list(top_mlp)}")


def check_multihot(cardinalities: Sequence[int], combiners: Sequence[str]) -> None:
    """One positive cardinality and one combiner (sum/mean) per multi-hot feature."""
    if any(int(c) < 1 for c in cardinalities):
        raise ValueError(f"multihot_cardinalities must be positive integers, got {list(cardinalities)}")
    if len(combiners) != len(cardinalities) or any(c not in ("sum", "mean") for c in combiners):
        raise ValueError(
            f"multihot_combiners needs one of 'sum'/'mean' per multi-hot feature ({len(cardinalities)}), "
            f"got {list(combiners)}"
        )
