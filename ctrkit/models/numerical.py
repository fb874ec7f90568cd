"""The numerical inputs: the normaliser every model applies to them, and the quantile buckets of the first-order
term, with the per-feature choice of their number."""

from __future__ import annotations

import torch
from torch import nn

# Quantile buckets per numerical feature in the first-order term: the count was chosen with scikit-learn's
# logistic regression on the accuracy panel's splits (docs/decisions/numerical-buckets.md).
NUMERICAL_BUCKETS = 16
MAX_BUCKETS = 1024
UNUSED_CUT = float(torch.finfo(torch.float32).max)  # a cut no finite float32 input lies beyond
MIN_RARER_PER_BUCKET = 100  # rows of the rarer label per bucket, on average (docs/decisions/numerical-buckets.md)


LOG_ABOVE = 50.0  # a numerical feature whose 99.9th percentile magnitude exceeds this is logged


NORMALIZER_ROWS = 262_144  # training rows the normalizer's statistics are taken from (at most)


class NumericalNormalizer(nn.Module):
    """The numerical features as the model sees them: each one standardised with statistics of the
    training data, after a signed log (``sign(x) * log(1 + |x|)``) where its values are raw amounts or
    counts (99.9th percentile of ``|x|`` above ``LOG_ABOVE``).

    A model is fitted (``fit``) before training starts, and its statistics are buffers saved with it, so
    evaluation, export and serving see the same inputs. Until then, and in checkpoints written without it,
    it is the identity. Why: raw prices or counts (values up to 1e5 and more, heavy tails) fed
    straight into the MLPs left every model at its logistic-regression warm start (docs/decisions/numerical-inputs.md).

    Shapes: numerical (B, N) -> (B, N), computed in float32, returned in the dtype of the module's buffers
    (float32, or bfloat16 in a model converted to it).
    """

    def __init__(self, num_numerical: int):
        super().__init__()
        self.register_buffer("log_mask", torch.zeros(num_numerical))  # (N,) 1.0 where the signed log applies
        self.register_buffer("shift", torch.zeros(num_numerical))  # (N,) subtracted after the log
        self.register_buffer("scale", torch.ones(num_numerical))  # (N,) then divided by
        self.num_numerical = num_numerical  # a Python int: a traced export reads no tensor size to branch on

    def forward(self, numerical: torch.Tensor | None) -> torch.Tensor | None:
        if numerical is None or self.num_numerical == 0:
            return numerical
        x = numerical.float()
        logged = torch.sign(x) * torch.log(1.0 + x.abs())  # log(1 + |x|): log1p is not in every exporter
        x = torch.where(self.log_mask > 0, logged, x)
        return ((x - self.shift.float()) / self.scale.float()).to(self.scale.dtype)  # a bf16 model: bf16 out

    @torch.no_grad()
    def fit(self, numerical: torch.Tensor) -> dict[str, list]:
        """Sets the statistics from (n, N) training values; returns them (which features are logged)."""
        x = numerical.double()
        if x.dim() != 2 or x.shape[1] != self.log_mask.numel():
            raise ValueError(f"expected (n, {self.log_mask.numel()}) numerical values, got {tuple(x.shape)}")
        if x.shape[0] == 0:
            return {"logged": []}
        high = torch.quantile(x.abs()[: 1 << 24], 0.999, dim=0)  # (N,)
        mask = high > LOG_ABOVE
        x = torch.where(mask, torch.sign(x) * torch.log1p(x.abs()), x)
        mean, std = x.mean(0), x.std(0) if x.shape[0] > 1 else torch.ones_like(x[0])
        std = torch.where(std > 1e-6, std, torch.ones_like(std))
        device = self.log_mask.device
        self.log_mask.copy_(mask.to(self.log_mask.dtype).to(device))
        self.shift.copy_(mean.to(self.shift.dtype).to(device))
        self.scale.copy_(std.to(self.scale.dtype).to(device))
        return {"logged": [int(i) for i in mask.nonzero().flatten()]}

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, *args):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, *args)
        names = [prefix + n for n in ("log_mask", "shift", "scale")]
        if not any(n in state_dict for n in names):  # a checkpoint from before the normalizer: the identity
            for n in names:
                if n in missing_keys:
                    missing_keys.remove(n)
            if self.log_mask.is_meta:  # built without memory to take a checkpoint's tensors: make them here
                self.log_mask, self.shift, self.scale = (
                    torch.empty(t.shape) for t in (self.log_mask, self.shift, self.scale)
                )
            with torch.no_grad():
                self.log_mask.zero_()
                self.shift.zero_()
                self.scale.fill_(1.0)


def normalizer_sample(dataset, labels: bool = False):
    """Up to ``NORMALIZER_ROWS`` rows of a dataset's numerical features, (n, N): 16 evenly spaced blocks
    (None without rows or numerical features); with ``labels``, ``(numerical, labels)`` of those rows."""
    n = len(dataset)
    if n == 0:
        return None
    take = min(n, NORMALIZER_ROWS)
    block = -(-take // 16)
    parts, label_parts = [], []
    for k in range(16):  # block k starts at the k-th sixteenth and never runs into block k + 1
        start = (n * k) // 16
        stop = min(start + block, (n * (k + 1)) // 16)
        if stop > start:
            batch = dataset.slice(start, stop)
            if batch.numerical is None:
                return None
            parts.append(batch.numerical)
            label_parts.append(batch.labels)
    return (torch.cat(parts), torch.cat(label_parts)) if labels else torch.cat(parts)


def bucket_of(values: torch.Tensor, cuts: torch.Tensor) -> torch.Tensor:
    """Each value's bucket: the number of cut points at or below it. ``values`` (..., N) against ``cuts``
    (N, C), or (n,) against (C,); int64."""
    return (values.unsqueeze(-1) >= cuts).sum(-1)


class _SummedWeights(torch.autograd.Function):
    """``weight[ids].sum(1)`` for a 1-D weight and (B, N) ids, its gradient added up by ``index_add_`` in the
    ids' order. torch's own backward of indexing adds with atomic operations from several threads once a batch
    holds more ids than ATen's grain (32,768: 2,521 rows of 13 features): there runs differed in the last
    bits, and it was slower."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.rows = weight.shape[0]
        return weight[ids].sum(1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (ids,) = ctx.saved_tensors
        per_id = grad.unsqueeze(1).expand(ids.shape).reshape(-1)  # (B * N,) row-major, as the ids
        return grad.new_zeros(ctx.rows).index_add_(0, ids.reshape(-1), per_id), None


class NumericalBuckets(nn.Module):
    """Per-bucket weights of the numerical features for the first-order term: each feature's values cut
    at quantiles of the training data into at most ``buckets`` intervals, one weight per interval, the
    weights of a sample's intervals summed. A first-order term linear in the values misses effects that
    are not monotone or not linear (a count's first few values, a price band); per-interval weights, as
    the Criteo competition's winners and Wide & Deep's bucketised columns use, fit them.

    The cut points are a buffer set by ``fit`` before training from the model's raw float32 inputs (the
    normaliser is monotone, so the buckets are the same as of its output, without a log whose last bit
    differs between machines, or a bf16 rounding, in the way): at the quantiles, each placed halfway between
    two neighbouring distinct training values, so a value the training data holds (a count) never sits on
    a cut. They stay float32 when the model is converted to another dtype. Unused cuts, and every cut until
    ``fit`` and in checkpoints from before buckets existed, are the largest float32 (finite, like every
    stored number; inputs are finite), and every weight starts at 0 (the term adds nothing). A bucket is
    the number of cut points at or below the value: a comparison and a sum, which every exporter has.

    Shapes: raw numerical (B, N) -> (B,) in the weights' dtype.
    """

    cuts: torch.Tensor  # buffers (``register_buffer``)
    offsets: torch.Tensor

    def __init__(self, num_numerical: int, buckets: int):
        super().__init__()
        self.buckets = buckets
        self.register_buffer("cuts", torch.full((num_numerical, buckets - 1), UNUSED_CUT))  # (N, buckets - 1)
        self.register_buffer(  # (N,) each feature's first weight; index data, even when built on meta
            "offsets", torch.arange(num_numerical, dtype=torch.int64, device="cpu") * buckets, persistent=False
        )
        self.weight = nn.Parameter(torch.zeros(num_numerical * buckets))  # (N * buckets,)

    def bucket_ids(self, numerical: torch.Tensor) -> torch.Tensor:
        """(B, N) int64: each value's weight index in ``weight``. In training, a binary search of each
        feature's sorted cuts (the same buckets; about half the time of the comparison's (B, N, cuts)
        intermediate on the CPU); otherwise the comparison, which every exporter has."""
        if torch.is_grad_enabled():
            # right=True: the number of cuts at or below the value, as bucket_of counts them
            found = torch.searchsorted(self.cuts.float(), numerical.float().t().contiguous(), right=True)  # (N, B)
            # row-major as the comparison's ids: the weights' gradient then sums in the same order (same bits)
            return found.t().contiguous() + self.offsets
        return bucket_of(numerical.float(), self.cuts.float()) + self.offsets  # (B, N)

    def forward(self, numerical: torch.Tensor) -> torch.Tensor:
        ids = self.bucket_ids(numerical)  # (B, N)
        if torch.is_grad_enabled():
            return _SummedWeights.apply(self.weight, ids)  # (B,); the same values
        return self.weight[ids].sum(1)  # (B,); indexing, which every exporter has

    def _apply(self, fn, recurse=True):
        cuts = self.cuts
        out = super()._apply(fn, recurse)
        if self.cuts.dtype != torch.float32 and cuts.is_floating_point():  # .to(bf16): cuts keep float32
            self.cuts = cuts.to(device=self.cuts.device, dtype=torch.float32)
        return out

    @torch.no_grad()
    def fit(
        self, numerical: torch.Tensor, rarer_label_rows: int | None = None, labels: torch.Tensor | None = None,
        seen: torch.Tensor | None = None,
    ) -> dict[str, list]:  # fmt: skip
        """Sets the cut points from (n, N) raw training values (the model's inputs); returns each feature's
        bucket count. ``rarer_label_rows``: the training rows of the rarer label (clicks, mostly); each
        bucket is then given at least ``MIN_RARER_PER_BUCKET`` of them on average, so fewer buckets are cut
        when the data holds few clicks (no cut at all where that leaves one bucket: a constant, which the
        bias already is). ``labels`` (n,) of the same rows, with ``seen`` (n, N), the values as the linear
        term sees them (normalised; the raw values if not given): each feature then keeps the bucket
        count, of the configured one and its halvings, or none, whose one-feature logistic regression (a
        bias, the linear term, the bucket weights) has the lowest Akaike criterion on these rows
        (``_akaike_choice``), so a feature whose effect the linear term already fits, or which has none,
        adds no bucket weights to be fitted to noise."""
        x = numerical.double()
        if x.dim() != 2 or x.shape[1] != self.cuts.shape[0]:
            raise ValueError(f"expected (n, {self.cuts.shape[0]}) numerical values, got {tuple(x.shape)}")
        cuts = torch.full(self.cuts.shape, UNUSED_CUT, dtype=torch.float64)
        counts = []
        buckets = self.buckets
        if rarer_label_rows is not None:
            buckets = min(buckets, rarer_label_rows // MIN_RARER_PER_BUCKET)
        tried: list[int] = []  # the bucket counts tried: the configured (or reduced) one and its halvings down to 2
        while x.shape[0] > 0 and buckets >= 2 and (not tried or labels is not None):
            tried.append(buckets)
            buckets //= 2
        # bucket count -> (N, count - 1) quantiles: torch.quantile's "lower" ones of the first 2^24 rows (the
        # sorted value at floor(q (n - 1))), from one sort of those rows that every count shares
        head = x[: 1 << 24]
        ordered = head.sort(dim=0).values if tried else head
        quantiles = {
            b: ordered[(torch.arange(1, b, dtype=torch.float64) / b * (len(head) - 1)).floor().long()].T.contiguous()
            for b in tried
        }
        y = labels.double() if labels is not None else None
        seen = numerical if seen is None else seen  # without a normaliser the linear term sees the raw values
        for f in range(x.shape[1] if tried else 0):
            # sorted, distinct
            values = torch.unique_consecutive(ordered[:, f]) if len(head) == len(x) else torch.unique(x[:, f])
            options = [self._place(values, quantiles[b][f]) for b in tried]
            if y is not None:
                s = seen[:, f].double()
                s = (s - s.mean()) / s.std().clamp_min(1e-12) if len(s) > 1 else s
                choice = _akaike_choice(x[:, f], values, s, y, options)
                options = [options[choice]] if choice is not None else []
            if options:
                cuts[f, : len(options[0])] = options[0]
            counts.append(len(options[0]) + 1 if options else 1)
        self.cuts.copy_(cuts.to(self.cuts.dtype).to(self.cuts.device))
        return {"buckets": counts or [1] * self.cuts.shape[0]}

    @staticmethod
    def _place(values: torch.Tensor, quantiles: torch.Tensor) -> torch.Tensor:
        """Cut points for sorted distinct ``values`` at ``quantiles``: each halfway between two neighbouring
        values (so a value the training data holds, a count, never sits on a cut), duplicates merged."""
        upper = torch.unique(torch.searchsorted(values, quantiles))  # each quantile's place among them
        upper = upper[upper > 0]  # a cut below the minimum would leave bucket 0 empty
        below, above = values[upper - 1], values[upper]
        cut = ((below + above) / 2).float().double()  # halfway to the distinct value below, as stored
        return torch.where(cut > below, cut, above)  # neighbouring float32 values: the upper one

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, *args):
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, *args)
        names = [prefix + n for n in ("cuts", "weight")]
        if not any(n in state_dict for n in names):  # a checkpoint from before the buckets: they add nothing
            for n in names:
                if n in missing_keys:
                    missing_keys.remove(n)
            if self.cuts.is_meta:  # built without memory to take a checkpoint's tensors: make them here
                self.cuts = torch.empty(self.cuts.shape)
                self.weight = nn.Parameter(torch.empty(self.weight.shape))
            with torch.no_grad():
                self.cuts.fill_(UNUSED_CUT)
                self.weight.zero_()


AKAIKE_PENALTY = 2.0  # criterion per weight in ``_akaike_choice`` (2: Akaike's)


BUCKET_RIDGE = 0.1  # L2 on the bucket weights in ``_akaike_choice``'s fits (keeps a bucket without clicks finite)


def _akaike_choice(
    x: torch.Tensor, values: torch.Tensor, s: torch.Tensor, y: torch.Tensor, options: list[torch.Tensor]
) -> int | None:
    """Which of ``options`` (cut points of one feature's raw values ``x``, whose sorted distinct ``values`` the fit
    has already found) to keep, or None for no buckets: the one whose logistic regression of labels ``y`` on a
    bias, the standardised linear input ``s`` and one weight per bucket has the lowest Akaike criterion (deviance
    + 2 x weights), against the bias and ``s`` alone. Fitted by Newton's method on sums per bucket, over the
    distinct values (rows of one value share ``s`` and the bucket, so only their count and clicks matter:
    O(distinct values) per step)."""
    inverse = torch.searchsorted(values, x.contiguous())  # each row's value among them
    weight = torch.bincount(inverse, minlength=len(values)).to(torch.float64)
    clicks = torch.bincount(inverse, y.to(torch.float64), minlength=len(values))
    s = torch.zeros(len(values), dtype=torch.float64).scatter_(0, inverse, s.to(torch.float64))  # one per value
    best, best_aic = None, _deviance(s, clicks, None, 0, weight=weight) + AKAIKE_PENALTY * 2
    for i, cut in enumerate(options):
        if len(cut) == 0:
            continue
        ids = bucket_of(values, cut)  # the model's rule (float64 here: the cuts are float32 values, so the same)
        k = len(cut) + 1
        aic = _deviance(s, clicks, ids, k, weight=weight) + AKAIKE_PENALTY * (2 + k - 1)
        if aic < best_aic:
            best, best_aic = i, aic
    return best


def _deviance(
    s: torch.Tensor, y: torch.Tensor, ids: torch.Tensor | None, k: int, steps: int = 30,
    weight: torch.Tensor | None = None,
) -> float:  # fmt: skip
    """-2 x the log-likelihood of logistic regression of ``y`` on [1, s, one-hot(ids) over k buckets] at its
    optimum (bucket weights under ``BUCKET_RIDGE``); ``ids`` None: [1, s] only. With ``weight``, each entry
    stands for ``weight`` rows of the same ``s`` and bucket, ``y`` of them clicked (``y`` is then a count)."""
    m = 2 + k
    c = torch.ones_like(s, dtype=torch.float64) if weight is None else weight
    theta = torch.zeros(m, dtype=torch.float64)
    ridge = torch.zeros(m, dtype=torch.float64)
    ridge[2:] = BUCKET_RIDGE
    ridge[:2] = 1e-9
    for _ in range(steps):
        z = theta[0] + theta[1] * s + (theta[2:][ids] if ids is not None else 0.0)
        p = torch.sigmoid(z)
        w, r = c * p * (1 - p), y - c * p
        h = torch.zeros(m, m, dtype=torch.float64)
        g = torch.zeros(m, dtype=torch.float64)
        h[0, 0], h[0, 1], h[1, 1] = w.sum(), (w * s).sum(), (w * s * s).sum()
        g[0], g[1] = r.sum(), (r * s).sum()
        if ids is not None:
            h[0, 2:] = torch.bincount(ids, w, minlength=k)
            h[1, 2:] = torch.bincount(ids, w * s, minlength=k)
            h[2:, 2:] = torch.diag(h[0, 2:])
            g[2:] = torch.bincount(ids, r, minlength=k)
        h = torch.triu(h) + torch.triu(h, 1).T + torch.diag(ridge)
        step = torch.linalg.solve(h, g - ridge * theta)
        theta += step
        if float(step.abs().max()) < 1e-8:
            break
    z = theta[0] + theta[1] * s + (theta[2:][ids] if ids is not None else 0.0)
    # each row's log loss, softplus(z) - y z (softplus as binary_cross_entropy_with_logits computes it), summed:
    # the rows of one entry share z
    softplus = z.clamp_min(0) + torch.log1p(torch.exp(-z.abs()))
    return float(2 * (c * softplus - y * z).sum())
