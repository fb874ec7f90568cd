"""`ctrkit bench epoch` on a small synthetic dataset: a real training process, its log read back into the
parts of the epoch and the phases, its memory sampled; condensed by collect.py."""

import json
import sys
from pathlib import Path

from tests.conftest import run_cli


def test_bench_epoch_measures_parts_phases_and_memory(tmp_path, capsys):
    out = tmp_path / "epoch.json"
    code, stdout, _ = run_cli("bench", "epoch", "--rows", "60000", "--tables", "1000,20000,50", "--work",
                              tmp_path / "work", "--embedding-dim", "8", "--batch-size", "256", "--output", out,
                              capsys=capsys)  # fmt: skip
    assert code == 0 and "one epoch of" in stdout and "Criteo 1TB epoch" in stdout
    result = json.loads(out.read_text())
    assert result["rows"] == 53_460 and result["steps"] == -(-53_460 // 256)  # 99% train, 10% of it validation
    assert len(result["shares"]) == 20 and all(s["samples_per_s"] > 0 for s in result["shares"])
    phases = result["phases_seconds"]
    assert phases["validation"] > 0 and phases["checkpoints"] > 0 and phases["test"] > 0
    assert 0 < phases["trainer in all"] < phases["process wall"]
    assert result["peak_rss_bytes"] > 100 * 2**20 and result["validation_samples_per_s"] > 0
    assert (tmp_path / "work" / "epoch.pt").exists()
    peaks = result["peak_anon_bytes_by_phase"]
    assert peaks["validation"] and peaks["before the first step"] and peaks["after the last step"]
    assert max(v for v in peaks.values() if v) <= result["peak_anon_bytes"]

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import collect

    written = json.loads(collect.collect("epoch", out, command="test", results=tmp_path / "results").read_text())
    assert len(written["rows"]) == 20 and written["rows"][0][0] == 53_460
    by_phase = {r[5]: r[7] for r in written["rows"] if r[5]}
    assert by_phase["validation"] == round(peaks["validation"] / 2**30, 2) and "after the last step" in by_phase
