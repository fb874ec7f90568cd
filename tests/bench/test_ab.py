from ctrkit.bench.ab import interleaved_rounds, summary


def test_interleaved_rounds_rotate_the_variants_and_time_each_round():
    """Each round switches every variant on before its steps, the order rotating by one a round; warm-up steps are
    run untimed; one figure per variant and round, and the summary's ratio is against the base."""
    log, state = [], {"v": None}
    variants = {k: (lambda k=k: state.update(v=k) or log.append(("switch", k))) for k in ("a", "b", "c")}
    times = interleaved_rounds(lambda b: log.append((state["v"], b)), [10, 20], variants, rounds=3, steps=3, warmup=1)
    switches = [k for kind, k in log if kind == "switch"]
    assert switches == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    first = log[: log.index(("switch", "b"))]
    assert first == [("switch", "a"), ("a", 10), ("a", 10), ("a", 20), ("a", 10)]  # warm-up, then 3 timed steps
    assert {k: len(v) for k, v in times.items()} == {"a": 3, "b": 3, "c": 3} and all(x > 0 for x in times["a"])
    lines = summary({"a": [2.0, 4.0], "b": [1.0, 1.0]}, "a", "m ")
    assert lines[0].startswith("m a: median 3.00 ms") and "a / a per round median 1.000" in lines[0]
    assert "a / b per round median 3.000" in lines[1]
