"""The first-order term fitted as a logistic regression before training (a warm start).

An SGD-trained first-order term stops far from a converged, L2-regularised logistic regression, and a
model that leans on it loses to that baseline on small real data (docs/decisions/warm-start.md). So training can start
from the converged fit: the model's first-order term (one weight per id, a linear map of the numerical features, a
weight per numerical bucket, a bias) is fitted by full-batch L-BFGS (diagonally preconditioned, closed-form gradients
over CSR matrices, on one thread where the design is small, stopped at a preconditioned gradient of ``TOLERANCE``:
measured faster than scikit-learn's solver on the same design at the same AUC, docs/decisions/first-order-solver.md)
on (at most ``max_rows`` of the last) training rows, with the L2 strength C chosen on the validation AUC of (at most
``max_rows`` of the first) validation rows as the scikit-learn baseline chooses it (numerical features standardised
inside the fit, as there), or, where validation holds few clicks, on the mean AUC over validation and four blocks of
the training rows; the deep part's output layer is zeroed, so the model starts as exactly that regression, and model
selection keeps it unless training improves validation AUC."""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ctrkit.device import one_thread
from ctrkit.distributed.hybrid import HybridModel
from ctrkit.distributed.sharded_embeddings import ShardedEmbeddingCollection
from ctrkit.metrics import roc_auc
from ctrkit.train.memory import WARM_START_ROWS

CS = (0.01, 0.03, 0.1, 0.3, 1.0)  # inverse L2 strengths tried, strongest first (each fit warm-starts the next)
CV_FOLDS = 4  # training blocks that also score each C where validation holds few rows of the rarer label
CV_BELOW_RARER = 1000  # "few": AUC's standard error is then about 0.01 or more, the size of C's effect
CV_MAX_ROWS = 250_000  # and the training rows at most this many
# designs of fewer entries are fitted on one intra-op thread: the solver's products and vector work are then too small
# to gain from a second thread, whose wake-ups cost more than they share, and threads that wait by spinning
# (OpenMP's default) lose most of their time when another process holds a core; L-BFGS stops where no
# preconditioned gradient entry exceeds TOLERANCE: docs/decisions/first-order-solver.md
ONE_THREAD_ENTRIES = 4_000_000
TOLERANCE = 1e-4


# the modules whose weights the fit sets: first-order tables, bucket weights, the deep output layer (zeroed)
# and the numerical first-order term
FIRST_ORDER_MODULES = ("wide_embeddings", "wide_buckets", "output_layer", "wide_dense")


def _collections(model: nn.Module) -> list[nn.Module]:
    """The first-order term's table collections (one-hot, then multi-hot), plain or sharded."""
    wide = model.wide_embeddings
    return [wide.onehot] + ([wide.bags] if wide.bags is not None else [])


class _Design:
    """A batch's ids over every first-order table as a sparse indicator matrix (multi-hot bags as indicator
    sums, or means for mean-pooled features), float64, in CSR by rows and (for the data fitted on, with
    ``transpose``) by columns too, so that both products of a gradient evaluation, ``X @ w`` and
    ``X.T @ r``, are row-parallel sparse matrix-vector products (autograd through a COO ``sparse.mm`` made
    the fit's cost). ``extra`` (n, m) adds m more indicators per row, ids into ``extra_size`` further
    columns (the numerical buckets).

    Only the columns that the fitted rows use are kept (``used``, the ids in order; ``columns`` maps every id to
    its place there, or -1): an id no fitted row holds has no loss gradient, so its L2-penalised weight stays 0,
    and L-BFGS's vector work shrinks to the ids seen. A design built with another's ``columns`` (the validation
    rows) drops its entries outside them, whose weights are 0. The indices are int32 where they fit: torch's CSR
    product by a vector takes a faster path for them than for int64 ones, with the same bits."""

    def __init__(
        self, batch, cards: list[tuple[int, ...]], multi_hot_means: tuple[bool, ...], transpose: bool,
        extra: torch.Tensor | None = None, extra_size: int = 0, columns: torch.Tensor | None = None,
    ):  # fmt: skip
        n = len(batch.labels)
        onehot_cards = cards[0]
        offsets = torch.tensor([0, *onehot_cards[:-1]], dtype=torch.int64).cumsum(0)
        ids, total = batch.categorical + offsets, sum(onehot_cards)
        bags = batch.multi_hot if len(cards) > 1 else None
        if bags is None:  # as many indicators in every row: the one-hot ids, then the buckets
            if extra is not None:
                ids, total = torch.cat([ids, total + extra], 1), total + extra_size
            self._build(n, total, ids.reshape(-1), None, ids.shape[1], columns, transpose)
            return
        col, val, crow = self._with_bags(ids, total, bags, cards[1], multi_hot_means, extra)
        self._build(n, total + sum(cards[1]) + (extra_size if extra is not None else 0), col, val, crow, columns,
                    transpose)  # fmt: skip

    @staticmethod
    def _with_bags(ids: torch.Tensor, total: int, mh, bag_cards: tuple[int, ...], means: tuple[bool, ...],
                   extra: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
        """Rows of the one-hot ids, then each multi-hot bag's ids (indicator sums, or means for mean-pooled
        features), then ``extra``'s: the entries (columns, values) in row order and each row's first entry, placed
        where they belong rather than sorted by row."""
        n, width = ids.shape
        lengths = mh.offsets[1:] - mh.offsets[:-1]  # (Fm * N,): bags feature by feature, each over the rows
        per = lengths.view(-1, n)
        before = (per.cumsum(0) - per).reshape(-1)  # a bag's place among its row's bags
        in_bags = per.sum(0)
        tail = 0 if extra is None else extra.shape[1]
        crow = torch.zeros(n + 1, dtype=torch.int64)
        crow[1:] = (in_bags + width + tail).cumsum(0)
        first = crow[:-1]
        col = torch.empty(int(crow[-1]), dtype=torch.int64)
        val = torch.ones(len(col), dtype=torch.float64)
        col[(first.unsqueeze(1) + torch.arange(width)).reshape(-1)] = ids.reshape(-1)
        bag = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # the bag of each id
        feature, sample = bag // n, bag % n
        place = first[sample] + width + before[bag] + torch.arange(len(bag)) - (mh.offsets[:-1][bag] - mh.offsets[0])
        del before
        bag_offsets = torch.tensor([0, *bag_cards[:-1]], dtype=torch.int64).cumsum(0)
        col[place] = total + bag_offsets[feature] + mh.ids
        is_mean = torch.tensor(means, dtype=torch.bool)[feature]
        val[place] = torch.where(is_mean, 1.0 / lengths[bag].clamp_min(1).double(), 1.0)
        del bag, feature, sample, place, is_mean
        if extra is not None:  # further indicator columns (the numerical features' buckets), (n, m) ids
            at = (first + width + in_bags).unsqueeze(1) + torch.arange(tail)
            col[at.reshape(-1)] = total + sum(bag_cards) + extra.reshape(-1)
        return col, val, crow

    def _build(self, n: int, total: int, col: torch.Tensor, val: torch.Tensor | None, row_width: torch.Tensor | int,
               columns: torch.Tensor | None, transpose: bool) -> None:  # fmt: skip
        """The matrices from entries in row order (``col``: ids of ``total``; ``val``: None for all ones): each
        row's first entry ``row_width`` (n + 1), or an int where every row holds that many. Built row by row, and
        by columns with one stable sort, in place of sorting every entry by its row (the sort and its index copies
        were most of the warm start's memory: docs/decisions/memory-plan.md)."""
        if columns is None:
            self.used = torch.nonzero(torch.bincount(col, minlength=total)).squeeze(1)
            columns = torch.full((total,), -1, dtype=torch.int32 if len(self.used) < 2**31 else torch.int64)
            columns[self.used] = torch.arange(len(self.used), dtype=columns.dtype)
        else:
            self.used = torch.nonzero(columns >= 0).squeeze(1)
        self.columns, width = columns, len(self.used)
        self.shape = (n, width)
        mapped = columns[col]
        del col
        uniform = isinstance(row_width, int)
        crow = torch.arange(0, n * row_width + 1, row_width) if uniform else row_width
        keep = mapped >= 0
        if not bool(keep.all()):  # rows with ids outside the columns (another design's): those entries dropped
            kept = torch.zeros(len(mapped) + 1, dtype=torch.int64)
            kept[1:] = keep.cumsum(0)
            crow, mapped, uniform = kept[crow], mapped[keep], False
            val = val[keep] if val is not None else None
        index = torch.int32 if max(mapped.numel(), n, width) < 2**31 else torch.int64
        col, crow = mapped.to(index), crow.to(index)
        del mapped, keep
        ones = val is None
        val = torch.ones(len(col), dtype=torch.float64) if ones else val
        self.rows = self._sparse(crow, col, val, (n, width))
        self.cols = None
        if transpose:  # by columns: each column's rows in row order (a stable sort of the entries by column)
            order = torch.sort(col, stable=True).indices
            if uniform:
                rows_of = (order // row_width).to(index)
            else:
                rows_of = torch.repeat_interleave(torch.arange(n, dtype=index), (crow[1:] - crow[:-1]).long())[order]
            crow_t = torch.zeros(width + 1, dtype=index)
            crow_t[1:] = torch.bincount(col, minlength=width).cumsum(0)
            self.cols = self._sparse(crow_t, rows_of, val if ones else val[order], (width, n))
            del order

    @staticmethod
    def _sparse(crow: torch.Tensor, col: torch.Tensor, val: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            return torch.sparse_csr_tensor(crow, col, val, shape, check_invariants=False)

    def expand(self, w: torch.Tensor) -> torch.Tensor:
        """Weights over the kept columns as weights over every id (0 for the others)."""
        out = torch.zeros(len(self.columns), dtype=w.dtype)
        out[self.used] = w
        return out

    def __matmul__(self, w: torch.Tensor) -> torch.Tensor:  # X @ w
        return self.rows @ w

    def rmatvec(self, r: torch.Tensor) -> torch.Tensor:  # X.T @ r
        return self.cols @ r


@torch.no_grad()
def _write_tables(model: nn.Module, weights: torch.Tensor) -> None:
    """Copies the fitted per-id weights into the first-order tables (whole, or this rank's shards)."""
    start = 0
    for coll in _collections(model):
        size = sum(coll.cardinalities)
        flat = weights[start : start + size].to(torch.float32).unsqueeze(1)  # (ids, 1)
        start += size
        if isinstance(coll, ShardedEmbeddingCollection):  # sharded: each local shard takes its rows
            offsets = [sum(coll.cardinalities[:f]) for f in range(len(coll.cardinalities))]
            for s, w in zip(coll.local, coll.shards):
                w.copy_(flat[offsets[s.feature] + s.row_lo : offsets[s.feature] + s.row_hi, s.col_lo : s.col_hi])
        else:
            coll.weight.copy_(flat)


def fit_first_order(
    model: nn.Module,
    train,
    validation,
    max_rows: int = WARM_START_ROWS,
    cs: tuple[float, ...] = CS,
    max_iter: int = 50,
    tolerance: float = TOLERANCE,
) -> dict[str, Any]:
    """Fits ``model``'s first-order term as an L2-regularised logistic regression and zeroes its deep
    output layer (see the module docstring). ``model`` is the single-process model or a rank's sharded
    one (every rank fits the same regression and keeps its shards of it).

    Returns:
        ``{"validation_auc", "C", "rows", "folds", "seconds"}`` (``folds``: the training blocks that scored
        each C besides the validation data; 0 where validation alone did).
    """
    start_time = time.perf_counter()
    inner = model.model if isinstance(model, HybridModel) else model  # a HybridModel wraps the model
    problem = _Regression(inner, train, validation, max_rows, max_iter, tolerance)
    with one_thread(int(problem.x_tr.rows.values().numel()) < ONE_THREAD_ENTRIES):
        c, theta, auc, folds = problem.choose_c(cs)
    problem.write(inner, theta)
    return {
        "validation_auc": auc,
        "C": c,
        "rows": problem.n,
        "folds": folds,
        "seconds": time.perf_counter() - start_time,
    }


class _Regression:
    """The first-order term's regression: the design matrices of the last ``max_rows`` training rows and the first
    ``max_rows`` validation rows (ids, their numerical buckets, and the numerical inputs standardised), the
    solver, and the choice of C."""

    def __init__(self, inner: nn.Module, train, validation, max_rows: int, max_iter: int, tolerance: float = TOLERANCE):
        start = max(0, len(train) - max_rows)
        tr, va = train.slice(start, len(train)), validation.slice(0, min(len(validation), max_rows))  # bounded
        dynamic = inner.dynamic_ids
        if dynamic is not None:  # raw ids: the fitted rows' ids admitted first, then both sides' ids as rows
            dynamic.preadmit(tr.categorical)
            tr.categorical, va.categorical = dynamic(tr.categorical), dynamic(va.categorical)
        self.cards = [tuple(c.cardinalities) for c in _collections(inner)]
        bags = inner.wide_embeddings.bags
        self.means = tuple(bool(m) for m in bags.is_mean) if bags is not None else ()  # plain or sharded bags
        self.dense, self.buckets = inner.wide_dense, inner.wide_buckets
        self.max_iter, self.tolerance = max_iter, tolerance
        self.x_tr = self._design(tr, transpose=True)
        tr.categorical, tr.multi_hot = None, None  # in the matrix now: not held twice
        self.x_va = self._design(va, transpose=False, columns=self.x_tr.columns)  # the training rows' ids
        va.categorical, va.multi_hot = None, None
        self.y_tr, self.y_va = tr.labels.double(), va.labels.numpy()
        self.n, self.ids = self.x_tr.shape
        self.k, self.z_tr, self.z_va = 0, None, None
        if self.dense is not None:
            norm = inner.numerical_norm

            def seen(x: torch.Tensor) -> torch.Tensor:  # the numerical inputs as the model sees them, on the CPU
                return (x if norm is None else norm(x.to(norm.shift.device)).cpu()).double()

            num_tr = seen(tr.numerical)
            self.mu, self.sd = num_tr.mean(0), num_tr.std(0).clamp_min(1e-6)
            self.z_tr, self.z_va = (num_tr - self.mu) / self.sd, (seen(va.numerical) - self.mu) / self.sd
            del num_tr
            self.k = self.z_tr.shape[1]
        # one flat parameter vector: per-id weights, numerical weights, bias; gradients computed in closed form.
        # L-BFGS runs on u = theta / scale, scale = the inverse square root of the Hessian's diagonal at p = 1/2
        # (an id seen m times: m / 4n + 2 * penalty): ids seen once and ids seen in every row then converge
        # alike instead of the rare ones needing thousands of iterations.
        counts = self.x_tr.rmatvec(torch.ones(self.n, dtype=torch.float64)) / self.n
        self.curvature = torch.cat([0.25 * counts, torch.full((self.k + 1,), 0.25, dtype=torch.float64)])
        self.u = torch.zeros(self.ids + self.k + 1, dtype=torch.float64, requires_grad=True)

    def _design(self, batch, transpose: bool, columns=None) -> _Design:
        """A batch's design matrix; each numerical value's bucket is one more column."""
        buckets = self.buckets
        if buckets is None:
            return _Design(batch, self.cards, self.means, transpose, columns=columns)
        ids = buckets.bucket_ids(batch.numerical.to(buckets.cuts.device)).cpu()
        return _Design(batch, self.cards, self.means, transpose, ids, buckets.weight.numel(), columns)

    def logit(self, x, z, t: torch.Tensor) -> torch.Tensor:
        out = x @ t[: self.ids] + t[-1]
        return out + z @ t[self.ids : self.ids + self.k] if self.k else out

    def solve(self, c: float, init: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
        """The regression at ``c`` from ``init``, over the rows of weight 1 (all rows without ``weight``)."""
        ids, k, u, x_tr, z_tr, y_tr = self.ids, self.k, self.u, self.x_tr, self.z_tr, self.y_tr
        n_fit = self.n if weight is None else float(weight.sum())
        penalty = 1.0 / (2.0 * c * n_fit)  # scikit-learn's C * sum(loss) + |w|^2 / 2, per sample
        scale = (self.curvature + 2.0 * penalty).rsqrt()
        scale[-1] = 2.0  # the bias is not penalised
        with torch.no_grad():
            u.copy_(init / scale)  # warm start from the previous C's solution
        opt = torch.optim.LBFGS(
            [u],
            lr=1.0,
            max_iter=self.max_iter,
            history_size=10,
            line_search_fn="strong_wolfe",
            tolerance_grad=self.tolerance,
            tolerance_change=1e-10,
        )

        def closure():
            t = u.detach() * scale
            s = self.logit(x_tr, z_tr if k else None, t)
            loss = F.binary_cross_entropy_with_logits(s, y_tr, weight=weight, reduction="sum") / n_fit
            loss = loss + penalty * t[:-1].pow(2).sum()
            r = (torch.sigmoid(s) - y_tr) / n_fit  # d loss / d logit
            if weight is not None:
                r = r * weight
            grad = torch.empty_like(t)
            grad[:ids] = x_tr.rmatvec(r)
            if k:
                grad[ids : ids + k] = z_tr.T @ r
            grad[-1] = r.sum()
            grad[:-1] += 2.0 * penalty * t[:-1]
            u.grad = grad * scale
            return loss

        opt.step(closure)
        return u.detach() * scale

    def _blocks(self) -> tuple[int, list[tuple[int, int, torch.Tensor]]]:
        """Few validation clicks (or non-clicks) rank C values by noise: then, on at most CV_MAX_ROWS training rows
        (the fits cost CV_FOLDS + 1 times one), C is chosen on the mean AUC over the validation data and CV_FOLDS
        contiguous blocks of the training rows, each block scored by a fit without it. Returns the folds and
        (first row, end, row weights without the block) of the blocks holding both labels."""
        n, y_tr = self.n, self.y_tr
        clicks = int(self.y_va.sum())
        rarer = min(clicks, len(self.y_va) - clicks)
        folds = CV_FOLDS if rarer < CV_BELOW_RARER and 2 * CV_FOLDS <= n <= CV_MAX_ROWS else 0
        blocks = []
        for f in range(folds):
            lo, hi = f * n // folds, (f + 1) * n // folds
            if y_tr[lo:hi].min() < y_tr[lo:hi].max():
                weight = torch.ones(n, dtype=torch.float64)
                weight[lo:hi] = 0.0
                blocks.append((lo, hi, weight))
        return folds, blocks

    def choose_c(self, cs: tuple[float, ...]) -> tuple[float, torch.Tensor, float, int]:
        """The regression at each C of ``cs`` in turn until the score falls; returns the best C, its parameters, its
        validation AUC and the folds that scored it besides validation."""
        k = self.k
        folds, blocks = self._blocks()
        theta = torch.zeros(self.ids + k + 1, dtype=torch.float64)
        block_thetas = [theta.clone() for _ in blocks]
        best = None
        for c in cs:
            theta = self.solve(c, theta, None)
            auc = roc_auc(self.y_va, self.logit(self.x_va, self.z_va if k else None, theta).numpy())
            scores = [auc]
            for b, (lo, hi, weight) in enumerate(blocks):
                block_thetas[b] = self.solve(c, block_thetas[b], weight)
                held = self.logit(self.x_tr, self.z_tr if k else None, block_thetas[b])[lo:hi]
                scores.append(roc_auc(self.y_tr[lo:hi].numpy(), held.numpy()))
            score = sum(scores) / len(scores)
            if best is None or score > best[0]:
                best = (score, c, theta.clone(), auc)
            else:  # the score over C rises to one peak: past it, weaker L2 only overfits more
                break
        _, c, t_best, auc = best
        return c, t_best, auc, folds

    def write(self, inner: nn.Module, t_best: torch.Tensor) -> None:
        """Writes the fit into ``inner``'s first-order term and zeroes its deep output layer."""
        ids, k, buckets, dense = self.ids, self.k, self.buckets, self.dense
        w_best, v_best, bias = self.x_tr.expand(t_best[:ids]), t_best[ids : ids + k], float(t_best[-1])
        tables = sum(sum(c) for c in self.cards)
        _write_tables(inner, w_best[:tables])
        output = inner.output_layer
        with torch.no_grad():
            if buckets is not None:
                buckets.weight.copy_(w_best[tables:].to(buckets.weight))
            output.weight.zero_()
            output.bias.zero_()
            if dense is not None:
                dense.weight.copy_((v_best / self.sd).to(dense.weight.dtype).unsqueeze(0))
                dense.bias.fill_(bias - float((v_best * self.mu / self.sd).sum()))
            else:
                output.bias.fill_(bias)
