"""The tf-idf similarity of one feature block at the real Outbrain scale, the whole-table join (the code before)
against the join of the block's documents' terms only (ctrkit.preprocess.outbrain._similarity now).

A synthetic term table the size of the real documents_topics.csv (about 11.3M rows over 2.99M documents,
each with 1-8 topics), and blocks of 131,072 rows (the --block-rows default) whose page and ad documents are
drawn uniformly. Prints seconds per block for each way (medians of ROUNDS interleaved rounds) and checks that
both give the same floats.
Usage: OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/results/outbrain_similarity/bench.py
"""

import os
import statistics
import sys
import time

import numpy as np
import polars as pl

from ctrkit.preprocess import outbrain

ROUNDS = int(os.environ.get("ROUNDS", "3"))
rng = np.random.default_rng(0)
n_docs, block = 2_990_000, 131_072
per_doc = rng.integers(1, 9, n_docs)  # 1-8 topics a document: ~13.5M rows
docs = pl.DataFrame(
    {
        "document_id": np.repeat(np.arange(n_docs), per_doc),
        "vid": rng.integers(0, 300, int(per_doc.sum())),
        "confidence_level": rng.random(int(per_doc.sum())),
    }
).unique(["document_id", "vid"], keep="first", maintain_order=True)
terms = outbrain._term_weights(docs)
rows = outbrain._TermRows(terms)  # built once per kind of term by the preprocessing
print(f"{len(terms):,} document terms over {n_docs:,} documents; blocks of {block:,} rows", flush=True)


def whole_table(terms: pl.DataFrame, pairs: pl.DataFrame) -> np.ndarray:  # the code before, verbatim
    unique = pairs.unique()
    dots = (
        unique.join(terms.rename({"document_id": "a", "u": "ua"}), on="a")
        .join(terms.rename({"document_id": "b", "u": "ub"}), on=["b", "vid"])
        .sort("a", "b", "vid")
        .group_by(["a", "b"], maintain_order=True)
        .agg((pl.col("ua") * pl.col("ub")).sum().alias("sim"))
    )
    out = pairs.join(dots, on=["a", "b"], how="left", maintain_order="left")["sim"].fill_null(0.0).fill_nan(0.0)
    return out.to_numpy().astype(np.float32)


times = {"whole table": [], "block's documents": []}
for _ in range(ROUNDS):
    a = rng.integers(0, n_docs, block)
    b = rng.integers(0, 120_000, block)  # ads point at fewer documents
    pairs, _ = outbrain._pairs(a, b)
    results = []
    for name, fn, table in (("whole table", whole_table, terms), ("block's documents", outbrain._similarity, rows)):
        t = time.perf_counter()
        results.append(fn(table, pairs))
        times[name].append(time.perf_counter() - t)
    assert np.array_equal(results[0], results[1]), "the two ways differ"
    assert (results[0] > 0).any()
for name, ts in times.items():
    print(f"{name}: {statistics.median(ts):.3f} s a block (rounds {', '.join(f'{t:.3f}' for t in ts)})")
print("identical similarities in every round;", sys.version.split()[0], "polars", pl.__version__)
