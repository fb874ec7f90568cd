"""Optimizers that accept sparse embedding gradients, and the learning-rate schedule."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ctrkit import hugepages, native
from ctrkit.device import one_thread_where_threads_sleep
from ctrkit.models.contract import tables_by_id
from ctrkit.models.tiered_tables import TieredTable
from ctrkit.optimizers import KINDS
from ctrkit.optimizers import kind as optimizer_kind


class SparseSGD(torch.optim.Optimizer):
    """Plain SGD for a mix of dense and sparse gradients.

    Dense gradients are applied with one fused ``_foreach_add_``. A sparse gradient (from an
    embedding with ``sparse=True``) is applied straight from its uncoalesced indices with
    ``scatter_add_`` over a row index expanded across columns: duplicate rows add up, which is the
    summed gradient, without coalescing. On the Criteo-Kaggle shape (53k looked-up rows of 16)
    this took ~2 ms against ~5.5 ms for ``index_add_`` and ~3.5 ms for ``index_put_`` here.
    Sparse gradients are consumed by ``step()``: their values are scaled by -lr in place. On the CPU,
    float32 tables take the same update from ctrkit/native/rows.c where its kernels are built
    (``native_on_cpu``): one pass, the same sums in the same order, without the scaled copy.
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float):
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        super().__init__(params, {"lr": lr})
        self.native_on_cpu = True

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim API
        for group in self.param_groups:
            lr = group["lr"]
            dense_p, dense_g = [], []
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                if g.is_sparse and self._native_step(p, g, lr):
                    continue
                if g.is_sparse:
                    rows = g._indices()[0].unsqueeze(1).expand(-1, p.shape[1])  # (nnz, D)
                    values = g._values()
                    # scaled in place: the gradient is consumed, and a fresh (nnz, D) buffer would
                    # cost more than the multiply
                    values = values.mul_(-lr) if values.dtype == p.dtype else values.to(p.dtype).mul_(-lr)
                    p.scatter_add_(0, rows, values)
                else:
                    dense_p.append(p)
                    dense_g.append(g)
            if dense_p:
                torch._foreach_add_(dense_p, dense_g, alpha=-lr)
        return None

    def _native_step(self, p: torch.Tensor, g: torch.Tensor, lr: float) -> bool:
        """``p[ids[i]] += -lr * values[i]`` by ctrkit/native/rows.c on a float32 CPU table; False (nothing
        done) where it does not apply: ``native_on_cpu`` off, no kernels built, other devices, dtypes or shapes."""
        lib = native.library() if self.native_on_cpu and p.device.type == "cpu" else None
        ids, values = g._indices()[0], g._values()
        if lib is None or p.dim() != 2 or values.dim() != 2 or len(ids) == 0:
            return False
        if p.dtype != torch.float32 or values.dtype != torch.float32 or not p.is_contiguous():
            return False
        ids, values = ids.contiguous(), values.contiguous()
        outside = lib.ctrkit_rows_sgd_f32(p.data_ptr(), values.data_ptr(), ids.data_ptr(), len(ids), p.shape[1],
                                          p.shape[0], lr)  # fmt: skip
        if outside:  # counted before any write: the table is unchanged
            low, high = torch.aminmax(ids)
            raise IndexError(f"{outside} row ids outside a table of {p.shape[0]} rows ({int(low)}..{int(high)})")
        torch.autograd.graph.increment_version(p)  # written through a pointer: as an in-place op would
        return True


@dataclass(frozen=True)
class LRSchedule:
    """Linear warmup, constant, then polynomial decay (the reference DLRM's schedule).

    ``lr(step)`` rises linearly from ``base_lr / warmup_steps`` to ``base_lr`` over the first
    ``warmup_steps`` steps, stays at ``base_lr`` until ``decay_start_step``, then decays as
    ``end_lr + (base_lr - end_lr) * (1 - t / decay_steps) ** power`` for ``t`` steps into the decay,
    and stays at ``end_lr`` afterwards. A stateless function of the step, so resuming is exact.

    ``kind="step"`` is the Wide & Deep seed's deep schedule instead: after the warmup, ``base_lr / 4``
    for the first half of the steps left until ``total_steps``, then ``base_lr / 8``.
    """

    base_lr: float
    warmup_steps: int = 0
    decay_start_step: int = 0
    decay_steps: int = 0
    power: float = 2.0
    end_lr: float = 0.0
    kind: str = "poly"
    total_steps: int = 0

    def __post_init__(self):
        if self.kind not in ("poly", "step"):
            raise ValueError(f"LR schedule kind must be poly or step, got {self.kind!r}")

    def __call__(self, step: int) -> float:
        if self.warmup_steps and step < self.warmup_steps:
            return self.base_lr * (step + 1) / self.warmup_steps
        if self.kind == "step":
            boundary = self.warmup_steps + (self.total_steps - self.warmup_steps) / 2
            return self.base_lr / (4.0 if step < boundary else 8.0)
        if self.decay_steps <= 0 or step < self.decay_start_step:
            return self.base_lr
        t = min(step - self.decay_start_step, self.decay_steps)
        return self.end_lr + (self.base_lr - self.end_lr) * (1.0 - t / self.decay_steps) ** self.power


class SparseRowOptimizer(torch.optim.Optimizer):
    """Adagrad, row-wise Adagrad, (lazy) Adam or FTRL-Proximal for embedding tables with sparse gradients.

    Only the rows a batch looked up are read and written, so a step costs O(rows used x D), not
    O(table). The gradient is coalesced first (duplicate ids summed), so the update is exactly the
    dense algorithm's for those rows; rows not in the batch keep their state, as in
    ``torch.optim.SparseAdam`` ("lazy" Adam). A dense gradient is treated as touching every row.

    ``rowwise_adagrad`` keeps one accumulator per row (the mean of the squared gradient over the
    row), a D-fold saving of optimizer memory that FBGEMM and TorchRec use for large tables.

    ``ftrl`` is FTRL-Proximal (McMahan et al., 2013) as TensorFlow's ``Ftrl`` computes it with its
    defaults (learning-rate power -1/2, accumulators starting at 0.1, no L1/L2): per weight, with
    ``n`` the accumulated squared gradient and ``z`` the linear term,
    ``n' = n + g^2``, ``z += g - (sqrt(n') - sqrt(n)) / lr * w``, ``w = -z * lr / sqrt(n')``.

    Args:
        params: 2-D embedding parameters.
        kind: "adagrad", "rowwise_adagrad" or "adam".
        lr: learning rate.
        eps: added to the denominator.
        betas: Adam's moment decay rates.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        kind: str,
        lr: float,
        eps: float | None = None,
        betas: tuple[float, float] = (0.9, 0.999),
        tiers: dict[int, TieredTable] | None = None,
        sort_cache: SortCache | None = None,
    ):
        stateful = [k.name for k in KINDS.values() if k.tables and (k.value_state or k.row_state)]
        if kind not in stateful:
            raise ValueError(f"unknown sparse optimizer '{kind}'; expected one of {', '.join(stateful)}")
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        default_eps = 1e-8 if kind == "adam" else 1e-10
        super().__init__(params, {"lr": lr, "eps": default_eps if eps is None else eps, "betas": betas})
        self.kind = kind
        self.record = KINDS[kind]  # its state (``optimizers.KINDS``)
        self.tiers = dict(tiers or {})  # tiered tables: parameter id -> its tier, which keeps its state too
        self.fused_on_cpu = True  # Adam and Adagrad by torch's fused kernels on the CPU (_fused_cpu_step)
        self.native_on_cpu = True  # ... and on sparse gradients by ctrkit/native's kernels where built (_native_step)
        self._deferred: list | None = None  # the C kernels' row updates, collected by step_deferring_rows
        self.sort_cache = sort_cache if sort_cache is not None else SortCache()  # shared by a run's optimizers

    def step_deferring_rows(self) -> list:
        """``step()``, except that the C kernels' row updates are returned instead of run: functions of (part,
        parts) that each update the part-th slice of a table's distinct rows, sorted, so that a split step runs the
        parts on its threads at once. A row's update is the same whichever part takes it. Everything else (the ids'
        sort, the other paths) runs now."""
        self._deferred = []
        try:
            self.step()
            return self._deferred
        finally:
            self._deferred = None

    def _state(self, p: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            state["step"] = 0
            for name, initial in self.record.value_state:  # table-sized, read and written at random rows
                state[name] = hugepages.full_like(p, initial)
            for name, initial in self.record.row_state:
                state[name] = hugepages.empty(p.shape[0], dtype=p.dtype, device=p.device).fill_(initial)
            if id(p) in self.tiers:  # a tiered table: its state in its home too, the cached rows here
                self.tiers[id(p)].attach(state)
        return state

    def _params(self) -> list[torch.nn.Parameter]:
        return [p for group in self.param_groups for p in group["params"]]

    def state_dict(self) -> dict:  # noqa: D102 - torch.optim API
        out = super().state_dict()
        for index, p in enumerate(self._params()):  # tiered tables: the whole state, as an in-memory table's
            tier = self.tiers.get(id(p))
            if tier is not None and index in out["state"]:
                entry = out["state"][index]
                out["state"][index] = {k: tier.whole_state(k) if k in tier.states else v for k, v in entry.items()}
        return out

    def load_state_dict(self, state_dict: dict) -> None:  # noqa: D102 - torch.optim API
        whole: dict[int, dict] = {}  # tiered tables: their states go to their homes, not into memory
        for index, p in enumerate(self._params()):
            tier = self.tiers.get(id(p))
            entry = state_dict["state"].get(index) if tier is not None else None
            if entry:
                rows = tier.rows
                whole[index] = {k: v for k, v in entry.items() if torch.is_tensor(v) and v.dim() and len(v) == rows}
        if whole:
            state_dict = {**state_dict, "state": {i: {k: v for k, v in e.items() if k not in whole.get(i, {})}
                                                  for i, e in state_dict["state"].items()}}  # fmt: skip
        super().load_state_dict(state_dict)
        # states read from a checkpoint were written on load: copied into huge-page tables like new ones
        for state in self.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.nbytes >= hugepages.MIN_BYTES:
                    state[key] = hugepages.empty_like(value).copy_(value)
        params = self._params()
        for index, entries in whole.items():
            p = params[index]
            for key, value in entries.items():
                self.state[p][key] = self.tiers[id(p)].load_state(key, value)

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - torch.optim API
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                state = self._state(p)
                state["step"] += 1
                fused = self.fused_on_cpu and p.device.type == "cpu" and self.kind in ("adam", "adagrad")
                if fused and g.is_sparse and self._native_step(group, p, state, g):
                    continue
                if g.is_sparse:
                    rows, values = _summed_rows(g, self.sort_cache)  # (U,), (U, D)
                    values = values.to(p.dtype)
                elif fused:
                    rows, values = None, g  # every row, in place: no index of the whole table
                else:
                    rows, values = torch.arange(p.shape[0], device=p.device), g
                if fused:
                    self._fused_cpu_step(group, p, state, rows, values)
                    continue
                if self.kind == "ftrl":  # sets the rows' weights rather than adding an update
                    n = state["accumulator"].index_select(0, rows)  # (U, D)
                    n_new = n + values * values
                    root_new = n_new.sqrt()
                    w = p.index_select(0, rows)
                    z = state["linear"].index_select(0, rows) + values - (root_new - n.sqrt()) / lr * w
                    state["accumulator"].index_copy_(0, rows, n_new)
                    state["linear"].index_copy_(0, rows, z)
                    p.index_copy_(0, rows, (-z * lr / root_new).to(p.dtype))
                    continue
                if self.kind == "adagrad":
                    acc = state["sum"].index_select(0, rows).addcmul_(values, values)  # (U, D)
                    state["sum"].index_copy_(0, rows, acc)
                    update = values / acc.sqrt_().add_(eps)
                elif self.kind == "rowwise_adagrad":
                    acc = state["sum"].index_select(0, rows) + values.pow(2).mean(1)  # (U,)
                    state["sum"].index_copy_(0, rows, acc)
                    update = values / acc.sqrt_().add_(eps).unsqueeze(1)
                else:
                    beta1, beta2 = group["betas"]
                    m = state["exp_avg"].index_select(0, rows).mul_(beta1).add_(values, alpha=1 - beta1)
                    v = state["exp_avg_sq"].index_select(0, rows).mul_(beta2).addcmul_(values, values, value=1 - beta2)
                    state["exp_avg"].index_copy_(0, rows, m)
                    state["exp_avg_sq"].index_copy_(0, rows, v)
                    t = state["step"]
                    update = (m / (1 - beta1**t)) / (v / (1 - beta2**t)).sqrt_().add_(eps)
                _add_to_rows(p, rows, update, -lr)
        return None

    def _native_step(self, group: dict, p: torch.Tensor, state: dict, g: torch.Tensor) -> bool:
        """Adam or Adagrad on a float32 table's looked-up rows by ctrkit/native/rows.c: each distinct row's
        gradients summed (in the batch's order, as ``_summed_rows`` sums them), the row and its states updated in
        place, one pass, instead of ``_summed_rows`` and ``_fused_cpu_step``'s seven passes over the rows. False
        (nothing done) where it does not apply: ``native_on_cpu`` off, no kernels built, other dtypes or shapes."""
        lib = native.library() if self.native_on_cpu else None
        names = ("exp_avg", "exp_avg_sq") if self.kind == "adam" else ("sum",)
        tensors = [p, *(state[n] for n in names)]
        ids, values = g._indices()[0], g._values()
        if lib is None or values.dim() != 2 or len(ids) == 0 or p.dim() != 2:
            return False
        if any(t.dtype != torch.float32 or not t.is_contiguous() for t in tensors):
            return False
        values = values.to(torch.float32).contiguous()  # (nnz, D)
        if g.is_coalesced():  # distinct ids already: each row its own run
            order = starts = torch.arange(len(ids))
            rows = ids.contiguous()
        else:
            with one_thread_where_threads_sleep(ids.device):
                order, rows, starts = self.sort_cache.sorted_ids(ids, p.shape[0])  # (nnz,), (U,), (U,) int64
        if rows[0] < 0 or rows[-1] >= p.shape[0]:  # ascending: the ends bound them (C would write past the table)
            raise IndexError(f"row ids {int(rows[0])}..{int(rows[-1])} outside a table of {p.shape[0]} rows")
        if self.kind == "adam":
            beta1, beta2 = group["betas"]
            kernel = lib.ctrkit_rows_adam_f32
            args = (group["lr"], beta1, beta2, group["eps"], float(state["step"]))
        else:
            kernel, args = lib.ctrkit_rows_adagrad_f32, (group["lr"], group["eps"])
        count, nnz, width = len(rows), len(ids), p.shape[1]
        operands = (*tensors, values, order)  # the closure keeps them (and rows, starts) alive until it runs

        def update(part: int = 0, parts: int = 1) -> None:  # distinct rows first..last - 1 of the sorted ones
            first, last = count * part // parts, count * (part + 1) // parts
            if first < last:  # the last row's gradients end where the next row's start (or at nnz)
                end = int(starts[last]) if last < count else nnz
                step = rows.element_size()
                kernel(*(t.data_ptr() for t in operands), rows.data_ptr() + step * first,
                       starts.data_ptr() + step * first, last - first, end, width, *args)  # fmt: skip

        for t in tensors:  # written through pointers: autograd's version counter learns of it as of an in-place op
            torch.autograd.graph.increment_version(t)
        if self._deferred is not None:
            self._deferred.append(update)  # holds rows, starts, order and values until it runs
        else:
            update()
        return True

    def _fused_cpu_step(self, group: dict, p: torch.Tensor, state: dict, rows, values) -> None:
        """Adam or Adagrad on the CPU: the batch's rows of the table and of its states gathered, updated by
        torch's fused kernel (the formulas of ``torch.optim.Adam`` / ``Adagrad``; one pass over the rows
        instead of about ten elementwise operations, each a parallel region that wakes the other threads),
        and written back. Same values as the operations below to float rounding (tests). A dense gradient
        (``rows`` None) updates the table in place. (torch's fused Adagrad is CPU-only; CUDA keeps the
        elementwise operations.)"""
        names = ("exp_avg", "exp_avg_sq") if self.kind == "adam" else ("sum",)
        if rows is None:
            weight, states = p, [state[n] for n in names]
        else:
            weight, states = p.index_select(0, rows), [state[n].index_select(0, rows) for n in names]
        steps = [torch.tensor(float(state["step"]))]
        if self.kind == "adam":
            beta1, beta2 = group["betas"]
            torch._fused_adam_(
                [weight], [values], states[:1], states[1:], [], steps, lr=group["lr"], beta1=beta1, beta2=beta2,
                weight_decay=0.0, eps=group["eps"], amsgrad=False, maximize=False,
            )  # fmt: skip
        else:
            torch._fused_adagrad_(
                [weight], [values], states, steps, lr=group["lr"], lr_decay=0.0, weight_decay=0.0, eps=group["eps"],
                maximize=False,
            )  # fmt: skip
        if rows is not None:
            for name, rows_state in zip(names, states):
                state[name].index_copy_(0, rows, rows_state)
            p.index_copy_(0, rows, weight)


def _add_to_rows(p: torch.Tensor, rows: torch.Tensor, update: torch.Tensor, alpha: float) -> None:
    """``p[rows] += alpha * update`` for distinct ``rows`` (U,): gathered, added and written back, 3-13x
    faster on the CPU than ``index_add_``, with the same sums."""
    if len(rows) == p.shape[0]:  # a dense gradient: every row, in order
        p.add_(update.to(p.dtype), alpha=alpha)
    else:
        p.index_copy_(0, rows, p.index_select(0, rows).add_(update.to(p.dtype), alpha=alpha))


def _summed_rows(g: torch.Tensor, cache: SortCache | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A sparse row gradient's distinct rows (ascending) and each one's summed gradient, as ``coalesce``
    gives them. The ids are sorted (stably, so each row's gradients are summed in the batch's order) and
    each distinct id's gradients summed as one bag of ``embedding_bag``: faster on the CPU than ``unique`` +
    ``index_add_``, itself faster than ``coalesce``. ``cache``: the sorts to reuse (None: a sort of its own)."""
    if g.is_coalesced():
        return g.indices()[0], g.values()
    ids, values = g._indices()[0], g._values()
    if values.dim() != 2 or len(ids) == 0:
        rows, inverse = torch.unique(ids, return_inverse=True)
        return rows, values.new_zeros((len(rows), *values.shape[1:])).index_add_(0, inverse, values)
    # one thread where idle threads sleep: the sort's passes and the sums are short parallel regions, each
    # paying for a wake-up (docs/decisions/omp-wait-policy.md)
    with one_thread_where_threads_sleep(ids.device):
        order, rows, starts = (cache if cache is not None else SortCache()).sorted_ids(ids, g.shape[0])
        return rows, F.embedding_bag(order, values.contiguous(), starts, mode="sum")  # (U, D)


class SortCache:
    """The last ids a table update sorted, with their sort, reused for equal ids: a model's first-order tables look
    up the same rows as its embeddings, so their gradients share one sort. One per run's optimizers
    (``build_optimizers``), shared by its row optimizers and by nothing else; the entry is one tuple, so that a thread
    reads a consistent one while another replaces it (a split step's optimizers run on two threads)."""

    def __init__(self) -> None:
        self.last: tuple | None = None  # (ids, order, rows, starts)
        self.sorts = 0  # sorts done (the others were reused)

    def sorted_ids(self, ids: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(nnz,) ids of a table of ``num_rows`` rows -> the stable sort's permutation (nnz,), the distinct ids
        (U,) and where each one's run starts in the permutation (U,). Ids are sorted as int32 where they fit
        (faster than int64 on the CPU)."""
        last = self.last
        if last is not None and last[0].shape == ids.shape and last[0].device == ids.device and torch.equal(
                last[0], ids):  # fmt: skip
            return last[1], last[2], last[3]
        sorted_ = _native_sort(ids, num_rows)
        if sorted_ is None:
            keys = ids.to(torch.int32) if num_rows <= 2**31 - 1 else ids
            ordered, order = torch.sort(keys, stable=True)
            rows, counts = torch.unique_consecutive(ordered, return_counts=True)
            sorted_ = order, rows.to(torch.int64), torch.cumsum(counts, 0) - counts
        self.last = (ids, *sorted_)
        self.sorts += 1
        return sorted_


def _native_sort(ids: torch.Tensor, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """``SortCache.sorted_ids`` by ctrkit/native/rows.c's radix sort (the same three tensors), or None where it does not
    apply: other devices or dtypes, tables or batches of 2^32 and more, ids outside the table (the callers' sort
    and checks then run), or no kernels built."""
    lib = native.library() if ids.device.type == "cpu" and ids.dtype == torch.int64 and ids.dim() == 1 else None
    n = len(ids)
    if lib is None or n == 0 or n >= 2**32 or num_rows >= 2**32:
        return None
    ids = ids.contiguous()
    order, rows, starts = (torch.empty(n, dtype=torch.int64) for _ in range(3))
    scratch = torch.empty(2 * n, dtype=torch.int64)
    count = lib.ctrkit_sort_ids(ids.data_ptr(), n, num_rows, order.data_ptr(), rows.data_ptr(), starts.data_ptr(),
                                scratch.data_ptr())  # fmt: skip
    if count < 0:
        return None
    return order, rows[:count], starts[:count]


def make_optimizer(
    kind: str,
    params: list[torch.nn.Parameter],
    lr: float,
    sparse: bool,
    tiers: dict[int, TieredTable] | None = None,
    sort_cache: SortCache | None = None,
) -> torch.optim.Optimizer:
    """Builds optimizer ``kind`` for ``params``.

    Args:
        kind: a name of ``optimizers.KINDS``.
        params: the parameters.
        lr: learning rate.
        sparse: the parameters are embedding tables that receive sparse gradients.
        tiers: the tiered tables among ``params`` (parameter id -> ``TieredTable``): their state is kept in their
            home too.
        sort_cache: the sorts a row optimizer shares with the run's others (None: its own).
    """
    optimizer_kind(kind)  # a known name
    if kind == "sgd":
        return SparseSGD(params, lr=lr)
    if kind == "rmsprop":
        if sparse:
            raise ValueError("rmsprop applies to the dense part (as NVIDIA's Wide & Deep trains its deep MLP); "
                             "use adam, adagrad, rowwise_adagrad, ftrl or sgd for embedding tables")  # fmt: skip
        return torch.optim.RMSprop(params, lr=lr, foreach=True)
    if sparse or kind == "ftrl":  # FTRL on dense parameters: every row, every step
        return SparseRowOptimizer(params, kind, lr, tiers=tiers, sort_cache=sort_cache)
    if kind == "adagrad":  # torch's fused Adagrad: one kernel instead of several passes (CPU only)
        fused = all(p.device.type == "cpu" for p in params)
        return (
            torch.optim.Adagrad(params, lr=lr, fused=True)
            if fused
            else torch.optim.Adagrad(params, lr=lr, foreach=True)
        )
    if kind == "adam":
        return torch.optim.Adam(params, lr=lr, fused=True)  # one kernel over all parameters (CPU and CUDA)
    raise ValueError(
        "rowwise_adagrad keeps one accumulator per embedding row and applies to embedding tables "
        "only; use adagrad or adam for the dense part"
    )


def build_optimizers(
    model: torch.nn.Module,
    optimizer: str,
    lr: float,
    embedding_optimizer: str,
    embedding_lr: float,
    wide_optimizer: str | None = None,
    wide_lr: float | None = None,
) -> list[torch.optim.Optimizer]:
    """Optimizers for the parts of a model.

    Embedding tables get ``embedding_optimizer`` (sparse row updates) and every other parameter
    ``optimizer``. A model with a wide (linear) part, i.e. a ``wide_parameters()`` method, trains
    those parameters with ``wide_optimizer`` instead (its table with sparse updates). Each parameter
    group remembers its ``base_lr``; the schedule scales it (see TrainStep).
    """
    tables = tables_by_id(model)  # embedding collections, single-process or sharded (``models.contract``)
    tiers = {i: m.tier for i, m in tables.items() if m.tier is not None}  # tiered tables
    wide = model.wide_parameters()
    wide_ids = {id(p) for p in wide}
    parts: list[tuple[str, list[torch.nn.Parameter], float, bool, bool]] = []
    if wide:
        if wide_optimizer is None or wide_lr is None:
            raise ValueError("this model has a wide part: set wide_optimizer and wide_lr")
        parts.append((wide_optimizer, [p for p in wide if id(p) in tables], wide_lr, True, True))
        parts.append((wide_optimizer, [p for p in wide if id(p) not in tables], wide_lr, False, True))
    rest = [p for p in model.parameters() if id(p) not in wide_ids]
    parts.append((embedding_optimizer, [p for p in rest if id(p) in tables], embedding_lr, True, False))
    parts.append((optimizer, [p for p in rest if id(p) not in tables], lr, False, False))
    out = []
    sorts = SortCache()  # the run's: its row optimizers share their sorts of equal ids
    for kind, params, part_lr, is_table, is_wide in parts:
        if not params:
            continue
        sparse = is_table and all(tables[id(p)].sparse for p in params)
        opt = make_optimizer(kind, params, part_lr, sparse=sparse, tiers=tiers, sort_cache=sorts)
        for group in opt.param_groups:
            group["base_lr"] = group["lr"]
        opt.is_table_optimizer = is_table  # its state is per table row (sharded in hybrid-parallel runs)
        opt.is_wide = is_wide  # the wide part's (TrainConfig.schedule_wide)
        out.append(opt)
    return out
