"""A CPU training step split over threads: each of N worker threads runs the forward and backward pass of its
slice of the batch with one intra-op thread, then the workers sum the slices' gradients and step the optimizers
between them; the tables' rows that the optimizers' C kernels leave to them are updated in pieces by whichever worker
is free (``RowWork``), in the same meeting.

Why: with one process on a few cores, ATen spreads every operation over all threads, and each parallel region
wakes the threads that slept since the last one (docs/decisions/omp-wait-policy.md); a step has hundreds of them. Here
each worker runs one thread's work from start to end and the threads meet twice a step (the slices; the optimizers
with the tables' rows). The step is the same step: the loss is the sum of each slice's summed loss over the whole
batch's size, each parameter's gradient is the slices' gradients summed in slice order (sparse ones concatenated in
slice order, which is the whole batch's own order of ids), and the optimizers see those. Float rounding differs from
the unsplit step (products over fewer rows), and a model with dropout draws each slice's masks from its own generator,
seeded each step from torch's global one, so a run is still reproducible.

The worker threads take one intra-op thread each: ``torch.set_num_threads(1)`` in a thread sets that thread's
OpenMP and MKL thread counts, after the thread's first ATen call (which would otherwise take the process's
count again); the calling thread's count is restored after.
"""

from __future__ import annotations

import atexit
import collections
import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

MIN_ROWS = 64  # the fewest samples a slice may hold for ``auto`` to split (smaller slices ran slower)
# an optimizer's work in ns: per sparse gradient row (the ids' sort and the rows' update) and per element; with the
# rows' update deferred, per row (the sort) and per element (the gradients' concatenation)
_SPARSE_ROW_COST, _ELEMENT_COST, _SORT_COST, _COPY_COST = 40.0, 3.0, 15.0, 0.3
_STOP = object()  # a worker's last job
EXIT_WAIT = 10.0  # seconds the process's exit waits for a worker still in a job


class _Worker:
    def __init__(self, name: str):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        torch.get_num_threads()  # the thread's first ATen call: it takes the process's count here, not later
        torch.set_num_threads(1)
        self.results.put(None)  # ready
        while True:
            job = self.jobs.get()
            if job is _STOP:
                return
            try:
                self.results.put((True, job()))
            except BaseException as e:  # raised again in the calling thread
                self.results.put((False, e))
            job = None  # not holding the step's slices and gradients until the next step


class ThreadTeam:
    """N daemon threads, each with one intra-op thread, that run one job each per ``run`` call."""

    def __init__(self, n: int):
        threads = torch.get_num_threads()
        self.workers = [_Worker(f"ctrkit-step-{i}") for i in range(n)]
        for w in self.workers:
            w.results.get()  # each has set its own count
        torch.set_num_threads(threads)  # the process's count again (the workers' calls changed its default)
        self.lock = threading.Lock()

    def run(self, jobs: Sequence[Callable[[], Any]]) -> list:
        """Runs ``jobs[i]`` on worker i (fewer jobs than workers leave the rest idle); returns their results in
        order, or raises the first job's exception in job order once all have finished."""
        if len(jobs) > len(self.workers):
            raise ValueError(f"{len(jobs)} jobs for a team of {len(self.workers)} threads")
        with self.lock:
            for w, job in zip(self.workers, jobs):
                w.jobs.put(job)
            outcomes = [w.results.get() for w, _ in zip(self.workers, jobs)]
        for ok, value in outcomes:
            if not ok:
                raise value
        return [value for _, value in outcomes]

    def stop(self, wait: float) -> None:
        """Ends the workers once each has finished its job, waiting up to ``wait`` seconds for each."""
        for w in self.workers:
            w.jobs.put(_STOP)
        for w in self.workers:
            w.thread.join(wait)


class RowWork:
    """A step's deferred row updates (``SparseRowOptimizer.step_deferring_rows``), shared by the workers as they come.
    Each update is cut into ``parts`` pieces (a row's update does not depend on the parting). A worker that has
    stepped its own optimizers takes pieces (``work``) until each of the ``producers`` optimizers that defer rows has
    handed its updates over (``add``) and none is left; so a worker whose optimizers finished first updates rows
    meanwhile, and the optimizers and the rows take one meeting. After ``fail`` no further piece starts (and nobody
    waits for the producers that will not hand over)."""

    def __init__(self, producers: int, parts: int):
        self.parts = parts
        self.pending = producers  # optimizers yet to hand over their updates
        self.tasks: collections.deque = collections.deque()
        self.failed = False
        self.cond = threading.Condition()

    def add(self, updates: Sequence[Callable[[int, int], None]]) -> None:
        """One producer's updates (possibly none)."""
        with self.cond:
            self.tasks.extend((u, k) for u in updates for k in range(self.parts))
            self.pending -= 1
            self.cond.notify_all()

    def fail(self) -> None:
        with self.cond:
            self.failed = True
            self.cond.notify_all()

    def work(self) -> None:
        while True:
            with self.cond:
                while not self.tasks and self.pending > 0 and not self.failed:
                    self.cond.wait()
                if self.failed or not self.tasks:
                    return
                update, part = self.tasks.popleft()
            update(part, self.parts)


_teams: dict[int, ThreadTeam] = {}
_teams_lock = threading.Lock()


def team(n: int) -> ThreadTeam:
    """The process's team of ``n`` workers, started on first use and kept (idle threads wait on a queue) until the
    process exits (``_stop_teams``)."""
    with _teams_lock:
        if not _teams:
            atexit.register(_stop_teams)
        if n not in _teams:
            _teams[n] = ThreadTeam(n)
        return _teams[n]


def _stop_teams() -> None:
    """Ends every team's workers before the interpreter finalizes. Why: a daemon thread still alive then is ended
    by the interpreter inside whatever it runs, and one ended inside torch's C++ aborts the process ("terminate
    called without an active exception", exit status -6) after its work is done and its output written."""
    with _teams_lock:
        teams = list(_teams.values())
        _teams.clear()
    for t in teams:
        t.stop(EXIT_WAIT)


def slices(size: int, n: int) -> list[slice]:
    """``n`` contiguous slices of ``range(size)``, their sizes differing by at most one."""
    bounds = [size * i // n for i in range(n + 1)]
    return [slice(a, b) for a, b in zip(bounds, bounds[1:])]


def sum_gradients(parts: Sequence[torch.Tensor | None], param: torch.Tensor | None = None) -> torch.Tensor | None:
    """One parameter's gradient from its slices' gradients: dense ones summed in slice order, sparse ones
    concatenated in slice order (uncoalesced, as the embedding's own backward gives them). A dense gradient comes
    back in ``param``'s layout, as ``backward()`` stores it: torch's fused Adam misreads a gradient whose strides
    differ from its parameter's (a transposed one updated the wrong elements, test)."""
    present = [g for g in parts if g is not None]
    if not present:
        return None
    first = present[0]
    if first.is_sparse:
        if len(present) == 1:
            return first
        indices = torch.cat([g._indices() for g in present], 1)
        values = torch.cat([g._values() for g in present], 0)
        return torch.sparse_coo_tensor(indices, values, first.shape, check_invariants=False)
    total = first if len(present) == 1 else present[0] + present[1]
    for g in present[2:]:
        total.add_(g)
    if param is not None and total.stride() != param.stride():
        total = torch.empty_like(param, dtype=total.dtype).copy_(total)
    return total


def optimizer_cost(opt: torch.optim.Optimizer, grads: dict[int, list[torch.Tensor | None]], deferred: bool) -> float:
    """A rough time of ``opt.step()`` from its parameters' gradients (ns): sparse rows cost more than elements
    (sorting and summing a batch's ids). ``deferred``: the step without its
    rows' update (``step_deferring_rows``)."""
    row, element = (_SORT_COST, _COPY_COST) if deferred else (_SPARSE_ROW_COST, _ELEMENT_COST)
    cost = 0.0
    for group in opt.param_groups:
        for p in group["params"]:
            for g in grads.get(id(p), ()):
                if g is None:
                    continue
                if g.is_sparse:
                    cost += row * g._nnz() + element * g._values().numel()
                else:
                    cost += _ELEMENT_COST * g.numel()
    return cost


def assign(costs: Sequence[float], n: int, first: Sequence[bool] | None = None) -> list[list[int]]:
    """Indices of ``costs`` dealt to ``n`` workers, largest first to the least loaded (ties: the lowest worker). Each
    worker's list is in index order, except that the indices marked in ``first`` come before the others, largest
    first: the split step marks the optimizers that hand rows over, so that the rows (which every worker takes) are
    ready as early as they can be rather than after a dense optimizer that happened to come first."""
    loads = [0.0] * n
    out: list[list[int]] = [[] for _ in range(n)]
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        w = min(range(n), key=lambda w: (loads[w], w))
        loads[w] += costs[i]
        out[w].append(i)
    if first is None:
        return [sorted(x) for x in out]
    return [sorted(x, key=lambda i: (not first[i], -costs[i] if first[i] else 0.0, i)) for x in out]
