"""The plan: every data-dependent setting resolved before the first step, printed, recorded in the run YAML and the
checkpoint, executed as recorded; the same under torchrun, or a one-line refusal."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from ctrkit.checkpoint import load_checkpoint
from ctrkit.config import TrainConfig
from ctrkit.device import Precision
from ctrkit.train import plan as plan_module
from ctrkit.train import plan_facts, plan_memory, plan_text
from ctrkit.train.run import Run, resolve_run
from ctrkit.train.sources import Layer, source
from tests.conftest import run_cli, small_model_flags
from tests.distributed.test_torchrun import torchrun

SMALL = {"embedding_dim": 8, "bottom_mlp": (32, 8), "top_mlp": (32, 1)}


def plan_of(dataset, model="dlrm", recipe=None, **train):
    return Run(
        resolve_run(dataset, model, recipe=recipe, model_config=SMALL, train=train, progress=False), dry_run=True
    ).plan


def topics(plan) -> dict[str, tuple[str, str]]:
    return {topic: (what, why) for topic, what, why in plan.lines}


def test_the_plan_resolves_every_data_dependent_setting_with_its_rule(tiny_dataset):
    plan = plan_of(tiny_dataset, batch_size=512)  # 19,440 training rows: 38 batches an epoch
    cfg = plan.train
    assert (cfg.epochs, cfg.early_stopping_patience, cfg.plateau_patience) == (10, *plan_module.PATIENCE)
    assert (cfg.warmup_steps, cfg.decay_steps) == (2, 0)  # 5% of the first epoch's 38; tuned plans no decay
    assert cfg.small_batch == 0 and plan.batches == (512,) and plan.members == (cfg,) and plan.models_per_request == 1
    lines = topics(plan)
    assert lines["epochs"] == ("at most 10", "the default maximum, 10")
    assert lines["schedule"] == ("warmup 2 steps, no decay", "recipe tuned")
    plain = plan_of(tiny_dataset, recipe="plain", batch_size=512)
    assert (plain.train.decay_steps, plain.train.decay_start_step) == (190, 190)  # the last half of 380 steps
    assert topics(plain)["schedule"][1] == "the last 50% of the planned steps"
    assert lines["ensembles"] == ("off: one model", "recipe tuned")
    assert lines["optimizers"][1] == "flag" or lines["optimizers"][1] == "dlrm's default"
    assert lines["first order"][0].startswith("on") and lines["warm start"][0].startswith("on")
    small = plan_of(tiny_dataset, batch_size=4096)  # 5 batches an epoch: small data
    assert small.train.epochs == 20 and small.train.early_stopping_patience == 20  # 100 steps; longer patience
    assert small.batches == (4096, 512) and len(small.members) == 2
    assert small.members[1].batch_size == 512 and small.members[1].epochs == 10  # its own epochs and schedule
    assert small.members[1].early_stopping_patience == 20  # ... the run's batch's patience
    assert topics(small)["epochs"][1] == "fewer than 10 batches an epoch: as many as make 100 steps"


def test_each_member_of_the_plan_is_decided_whole(tiny_dataset):
    """Plan.members: every member's settings, its seed and batch included; None only where it means none, or the
    device's default precision (which the plan names)."""
    plan = plan_of(tiny_dataset, batch_size=4096, seed=5, seed_ensemble=2)  # small data: two batch sizes
    assert [(m.batch_size, m.seed) for m in plan.members] == [(4096, 5), (512, 5), (4096, 6), (512, 6)]
    meaning_none = {"max_steps", "checkpoint_every", "embedding_cache_rows", "precision", "amp_dtype", "eval_dtype"}
    for member in plan.members:
        assert {k for k, v in member.to_dict().items() if v is None} <= meaning_none
    assert plan.precision.name in ("fp32", "bf16")
    assert plan.members[2] == replace(plan.members[0], seed=6) and plan.members[3] == replace(plan.members[1], seed=6)


def test_given_values_and_recipes_are_kept_and_named(tiny_dataset):
    plan = plan_of(tiny_dataset, epochs=3, warmup_steps=7, decay_steps=0, snapshot_ensemble=3)
    assert (plan.train.epochs, plan.train.warmup_steps, plan.train.decay_steps) == (3, 7, 0)
    lines = topics(plan)
    assert lines["epochs"] == ("at most 3", "flag") and "no decay" in lines["schedule"][0]
    assert lines["ensembles"][1] == "flag" and plan.models_per_request == 3
    assert lines["scoring"][0] == "3 models a request at most"
    single = plan_of(tiny_dataset, epochs=3)
    assert plan.memory["copies"] == single.memory["copies"] + 3 * single.memory["weights"]  # the snapshot pool
    plain = topics(plan_of(tiny_dataset, recipe="plain"))
    assert plain["first order"] == ("off", "recipe plain") and plain["warm start"][0].startswith("off")
    assert plain["calibration"] == ("off", "recipe plain") and plain["buckets"][0] == "off"
    none = topics(plan_of(tiny_dataset, validation_fraction=0))
    assert none["early stop"][0] == "off; the last weights kept" and none["warm start"][0] == "off (no validation data)"


def test_a_plan_that_cannot_be_carried_out_is_one_line(tiny_dataset):
    spec = resolve_run(tiny_dataset, "dlrm", model_config=SMALL, train={"snapshot_ensemble": 3})
    with pytest.raises(
        ValueError,
        match=r"^--snapshot-ensemble 3: a snapshot ensemble cannot be planned: a "
        r"distributed \(torchrun\) run trains one model; set --snapshot-ensemble 1$",
    ):
        plan_module.make_plan(spec, 19_440, 2_160, "x", processes=2)
    spec = resolve_run(tiny_dataset, "dlrm", model_config=SMALL, train={"batch_size": 4096})
    assert plan_module.make_plan(spec, 19_440, 2_160, "x", processes=2).batches == (4096,)  # small data: one batch


def test_dry_run_prints_the_plan_and_writes_nothing(tiny_dataset, tmp_path, capsys):
    ckpt = tmp_path / "run.pt"
    code, out, err = run_cli(
        "train",
        "--dataset",
        tiny_dataset,
        *small_model_flags(),
        "--dry-run",
        "--save-checkpoint",
        ckpt,
        "--recipe",
        "plain",
        capsys=capsys,
    )
    assert code == 0 and not list(tmp_path.iterdir())
    lines = out.strip().splitlines()
    assert lines[0].startswith("plan: dlrm, recipe plain")
    topics = [
        "data",
        "epochs",
        "early",
        "optimizers",
        "schedule",
        "plateau",
        "first",
        "buckets",
        "warm",
        "redraws",
        "batches",
        "ensembles",
        "calibration",
        "execution",
        "tables",
        "memory",
        "scoring",
    ]
    assert [line.split()[0] for line in lines[1:]] == topics


def test_the_run_yaml_and_checkpoint_record_the_plan_the_trainer_ran(tiny_dataset, tmp_path, capsys):
    ckpt, log = tmp_path / "run.pt", tmp_path / "log.jsonl"
    code, _, err = run_cli(
        "train",
        "--dataset",
        tiny_dataset,
        *small_model_flags(),
        "--epochs",
        "2",
        "--no-progress",
        "--save-checkpoint",
        ckpt,
        "--log-path",
        log,
        capsys=capsys,
    )
    assert code == 0
    printed = err[err.index("plan: dlrm") :].splitlines()
    run_yaml = yaml.safe_load(ckpt.with_suffix(".yaml").read_text())
    saved = load_checkpoint(ckpt)
    assert run_yaml["plan"] == saved.plan and saved.plan["models_per_request"] == 1
    for shown, line in zip(printed[1:], saved.plan["lines"], strict=True):  # the block printed is the one saved
        assert shown.split()[0] == line["topic"].split()[0] and line["what"] in shown
    start = next(json.loads(r) for r in log.read_text().splitlines() if '"start"' in r)
    ran = start["config"]
    assert (ran["epochs"], ran["early_stopping_patience"], ran["plateau_patience"]) == (2, *plan_module.PATIENCE)
    assert ran["warmup_steps"] is not None and ran["decay_start_step"] is not None  # nothing left to the trainer
    assert saved.train_config == ran
    again = run_cli("train", "--config", ckpt.with_suffix(".yaml"), "--dry-run", capsys=capsys)  # the YAML reads back
    assert again[0] == 0 and again[1].startswith("plan: dlrm, recipe tuned")


def test_help_texts_state_the_plans_rules():
    fields = TrainConfig.__dataclass_fields__
    assert str(plan_module.DEFAULT_EPOCHS) in fields["epochs"].metadata["unset"]
    assert (
        f"{plan_module.PATIENCE[0]}, or {plan_module.SMALL_DATA_PATIENCE[0]}"
        in (fields["early_stopping_patience"].metadata["unset"])
    )
    assert (
        f"{plan_module.PATIENCE[1]}, or {plan_module.SMALL_DATA_PATIENCE[1]}"
        in (fields["plateau_patience"].metadata["unset"])
    )
    small = fields["small_batch"].metadata["unset"]
    assert f"fewer than {plan_module.SMALL_EPOCH} batches" in small and f"/ {plan_module.SMALL_BATCH_STEPS}" in small
    assert f"{plan_module.WARMUP_SHARE:.0%} of the first epoch" in fields["warmup_steps"].metadata["unset"]


def test_torchrun_plans_what_one_process_plans(tiny_dataset, capsys):
    flags = ["train", "--dataset", tiny_dataset, *small_model_flags(), "--dry-run"]
    code, one, _ = run_cli(*flags, capsys=capsys)
    assert code == 0
    two = torchrun(*flags).stdout

    def without_execution(text: str) -> list[str]:  # and memory: each process's share, measured as it plans
        return [line for line in text.splitlines() if not line.strip().startswith(("execution", "memory"))]

    assert without_execution(two) == without_execution(one)  # every mechanism and value the same
    memory = next(line for line in two.splitlines() if line.strip().startswith("memory"))
    assert "MiB a process:" in memory and "more of" in memory
    assert "execution    2 processes, cpu, fp32" in two and "execution    one process, cpu, batch split" in one


def test_buckets_are_off_in_the_default_and_a_flag_turns_them_on(tiny_dataset, capsys):
    code, out, _ = run_cli("train", "--dataset", tiny_dataset, *small_model_flags(), "--dry-run", capsys=capsys)
    assert code == 0 and "  buckets      off  [recipe tuned]" in out
    code, out, _ = run_cli(
        "train",
        "--dataset",
        tiny_dataset,
        *small_model_flags(),
        "--dry-run",
        "--numerical-buckets",
        "16",
        capsys=capsys,
    )
    assert code == 0 and "  buckets      up to 16 quantile buckets a numerical in the first-order term  [flag]" in out


def test_the_plan_warns_where_the_data_cannot_carry_the_settings(tiny_dataset):
    """NVIDIA's batch of 65,536 on 19,440 rows (the 10% held out): one step an epoch, a warmup longer than the run;
    said, not run silently. A run that fits says nothing."""
    warned = [what for topic, what, _ in plan_of(tiny_dataset, recipe="nvidia").lines if topic == "warning"]
    assert any("batch of 65,536 is larger than the 19,440 training rows" in w for w in warned), warned
    assert any("warmup of" in w and "never reach their peak" in w for w in warned), warned
    assert any("too few to train" in w for w in warned), warned
    assert not [t for t, _, _ in plan_of(tiny_dataset, batch_size=256).lines if t == "warning"]
    assert not [t for t, _, _ in plan_of(tiny_dataset, batch_size=4096, max_steps=5).lines if t == "warning"]


def test_precision_is_decided_by_the_plan_from_the_devices_facts(tiny_dataset):
    """The device's capability is one of the plan's facts (``device.DeviceFacts``): the same settings planned for an
    AVX2 CPU, a CPU with native bf16, an H100 and an older GPU, with no such hardware here, give each device's
    precision, the scoring dtype and the execution line's words."""
    from dataclasses import replace

    from ctrkit.device import DeviceFacts
    from ctrkit.train.memory import Room

    def planned(hardware: DeviceFacts, **train):
        spec = resolve_run(tiny_dataset, "dlrm", train={"batch_size": 512, **train}, progress=False)
        facts = plan_facts.facts_of(spec, 19_440, 2_160, "the last 10%", 1, "cpu")  # (the room measured here)
        facts = replace(facts, device=hardware.kind, hardware=hardware, room=Room(64 << 30, "a given room"),
                        host_room=Room(64 << 30, "a given room"))  # fmt: skip
        plan = plan_module.plan_run(spec, facts)
        return plan.precision, topics(plan)["execution"][0]

    avx2, native = DeviceFacts("cpu", False, name="AVX2"), DeviceFacts("cpu", True, name="AVX512")
    h100, older = DeviceFacts("cuda", True, True, "H100"), DeviceFacts("cuda", False, False, "T4")
    decided, line = planned(avx2)
    assert decided == Precision("fp32", "", None) and "fp32" in line
    assert planned(native)[0] == Precision("bf16", "", None)  # the default: bf16 trained, scored in fp32
    assert "this device's default" in planned(native)[1]
    assert planned(avx2, amp=True)[0] == Precision("fp32", "this CPU has no native bf16", None)
    assert "fp32 (autocast asked: this CPU has no native bf16)" in planned(avx2, amp=True)[1]
    # a GPU: fp32 at a 512-sample step (autocast pays from 16,384), bf16 or fp16 where a dtype is asked for
    assert planned(h100)[0].name == "fp32" and planned(h100, batch_size=16_384)[0].name == "bf16"
    assert planned(h100, amp_dtype="bf16")[0] == Precision("bf16", "", "bf16")  # asked: scored in it too
    assert planned(older, precision="fp16")[0] == Precision("fp16", "", "fp16")
    assert planned(h100, precision="tf32")[0] == Precision("tf32", "", None)
    assert planned(older, precision="tf32")[0] == Precision("fp32", "this GPU has no TF32 tensor cores", None)
    assert planned(older, precision="bf16", eval_dtype="fp32")[0].scored_in is None


def test_the_plan_is_a_function_of_the_settings_and_the_facts(tiny_dataset):
    """``plan_run`` applies every rule to what it is given: the same facts give the same plan; the room measured is
    one of the facts, so the memory rule is exercised with a room given here (no cgroup needed)."""
    from dataclasses import replace

    from ctrkit.train.memory import Room

    def spec_of(**train):
        return resolve_run(
            tiny_dataset,
            "dlrm",
            model_config={"embedding_dim": 64},
            train={"batch_size": 512, "linear_warm_start": False, "best_weights": "memory", **train},
            progress=False,
        )

    spec = spec_of()
    facts = plan_facts.facts_of(spec, 19_440, 2_160, "the last 10%", 1, "cpu")
    roomy = replace(facts, room=Room(64 << 30, "a given room"))
    assert plan_module.plan_run(spec, roomy) == plan_module.plan_run(spec, roomy)
    assert plan_module.plan_run(spec, roomy).train.embedding_optimizer == "adam"  # dlrm's own
    adam = plan_module.plan_run(spec, roomy).memory["more"]
    rowwise = plan_module.plan_run(spec_of(embedding_optimizer="rowwise_adagrad"), roomy).memory["more"]
    assert rowwise < adam
    # room for the tables with row-wise Adagrad's state (one value a row), not Adam's (two a value)
    between = replace(facts, room=Room(int((adam + rowwise) / 2 / plan_memory.USABLE), "a given room"))
    plan = plan_module.plan_run(spec, between)
    assert (plan.train.embedding_optimizer, plan.train.embedding_lr) == (
        "rowwise_adagrad",
        plan_memory.ROWWISE_ADAGRAD_LR,
    )
    assert "memory: adam's state would need" in topics(plan)["optimizers"][1]
    with pytest.raises(ValueError, match="needs a peak of about"):
        plan_module.plan_run(spec, replace(facts, room=Room(1 << 20, "a given room")))


def test_a_gpu_run_whose_tables_do_not_fit_the_gpu_keeps_them_in_host_memory(tiny_dataset):
    """On a GPU the plan's last resort before refusing is the host-memory tier (``embedding_storage`` host): the
    tables and their state in the CPU's memory, as many rows cached on the GPU as half its room left holds; where
    the CPU's memory cannot hold them either, a one-line refusal."""
    from dataclasses import replace

    from ctrkit.train.memory import Room

    spec = resolve_run(
        tiny_dataset,
        "dlrm",
        model_config={"embedding_dim": 8192},  # tables of 256 MiB: most of what the run holds
        train={
            "batch_size": 64,
            "linear_warm_start": False,
            "embedding_optimizer": "rowwise_adagrad",
            "best_weights": "disk",
        },  # fmt: skip
        progress=False,
    )
    facts = plan_facts.facts_of(spec, 19_440, 2_160, "the last 10%", 1, "cpu")
    host = Room(64 << 30, "the host's room")
    whole = plan_module.plan_run(spec, replace(facts, device="cuda", room=host, host_room=host)).memory
    gpu = Room(int(whole["more"] * 0.9 / plan_memory.USABLE), "the GPU's free memory", per_process=True)
    on_gpu = replace(facts, device="cuda", room=gpu, host_room=host)
    plan = plan_module.plan_run(spec, on_gpu)
    rows = facts.sizes.table_rows
    assert plan.train.embedding_storage == "host"
    assert 0 < plan.train.embedding_cache_rows < rows
    assert plan.memory["more"] <= gpu.bytes * plan_memory.USABLE  # what the GPU holds: the cache, not the tables
    assert plan.memory["tables_in_tier"] >= whole["weights"] - plan.memory["weights"]
    what, why = topics(plan)["tables"]
    assert what.startswith("in host memory (") and "cached on cuda" in what and "the GPU's free memory" in why
    # the same run on the CPU: nowhere but disk; a user's host on the CPU keeps every row cached
    assert plan_module.plan_run(spec, replace(facts, room=gpu)).train.embedding_storage == "disk"
    with pytest.raises(ValueError, match=r"^the tables in host memory need about .* the host's room has"):
        plan_module.plan_run(spec, replace(on_gpu, host_room=Room(1 << 20, "the host's room")))
    distributed = replace(on_gpu, distributed=True, processes=2)
    with pytest.raises(ValueError, match="tiered tables train in one process"):
        plan_module.plan_run(resolve_run(tiny_dataset, "dlrm", train={"embedding_storage": "host"}, progress=False),
                             distributed)  # fmt: skip


def test_the_plan_says_how_long_a_long_table_build_takes(tiny_dataset):
    """Where a fresh run's tables take ``LONG_BUILD_S`` or more to draw, the tables line says about how long (the
    values over the draw rate on the run's threads, and on a CPU the first touch of their memory)."""
    from dataclasses import replace

    from ctrkit.train.memory import Room

    spec = resolve_run(tiny_dataset, "dlrm", train={"batch_size": 512}, progress=False)
    facts = replace(plan_facts.facts_of(spec, 19_440, 2_160, "the last 10%", 1, "cpu"), threads=2)
    assert "drawn in" not in topics(plan_module.plan_run(spec, facts))["tables"][0]
    fl15 = 4_190_000_000 * 4  # FL15 at width 128: the tables' bytes, built in under LONG_BUILD_S
    assert plan_text.build_seconds(replace(facts, sizes=replace(facts.sizes, tables=fl15))) < plan_text.LONG_BUILD_S
    big = 4 * fl15  # the room below holds them
    roomy = replace(facts, sizes=replace(facts.sizes, tables=big), room=Room(1 << 40, "a given room"))
    expected = plan_text.build_seconds(roomy)
    assert expected == pytest.approx(
        16.76e9 / (2 * plan_text.DRAW_VALUES_PER_S) + big / plan_text.TOUCH_BYTES_PER_S, rel=1e-3
    )
    what = topics(plan_module.plan_run(spec, roomy))["tables"][0]
    assert what == f"in memory, drawn in about {expected:.0f} s (16.76B values on 2 threads of the CPU)"
    on_gpu = replace(roomy, device="cuda", threads=16, host_room=roomy.room)  # drawn on the GPU: not estimated
    assert plan_text.build_seconds(on_gpu) == 0
    assert topics(plan_module.plan_run(spec, on_gpu))["tables"][0] == "on cuda"


def test_a_flag_for_features_the_data_lacks_is_refused(tiny_dataset):
    """``--combiner`` pools multi-hot features and ``--admit-after`` admits raw ids: on data without them each is
    refused by the plan in one line naming the flag, where a recipe's or a default's value is left alone."""
    cases = (({"combiner": "sum"}, {}, "--combiner"), ({}, {"admit_after": 3}, "--admit-after"))
    for model_config, train, flag in cases:
        spec = resolve_run(tiny_dataset, "dlrm", model_config={**SMALL, **model_config}, train=train, progress=False)
        with pytest.raises(ValueError, match=f"^{flag}: .* this dataset has none .*; drop the flag$"):
            Run(spec, dry_run=True)
    plan = plan_of(tiny_dataset)  # both unset: no refusal, and the default left as it is
    assert plan.train.admit_after == TrainConfig().admit_after
    # a recipe's pooling (NVIDIA's Wide & Deep sums its bags) on the same data: from the recipe, not refused
    spec = resolve_run(tiny_dataset, "wide_deep", recipe="nvidia", model_config={"deep_mlp": (16,)}, progress=False)
    assert source(spec.sources, "combiner").layer is Layer.RECIPE
    assert Run(spec, dry_run=True).plan.recipe == "nvidia"
