import json
from pathlib import Path

import numpy as np
import pytest
import torch

from ctrkit.checkpoint import CheckpointError, load_checkpoint
from ctrkit.config import TrainConfig
from ctrkit.data.dataset import SplitBinaryDataset
from ctrkit.data.feature_spec import FeatureSpec
from ctrkit.data.synthetic import SyntheticCTR
from ctrkit.eval.evaluator import evaluate
from ctrkit.metrics import roc_auc
from ctrkit.models import DLRMConfig, create_model
from ctrkit.train.plan import resolved_train
from ctrkit.train.run import settled
from ctrkit.train.trainer import DECIDED, Placement, RunInfo, RunOutputs, TrainData, Trainer, schedule_of
from tests.conftest import trainer_of

CPU = torch.device("cpu")


def build(
    dataset: Path, cfg: TrainConfig, save: Path | None = None, log: Path | None = None, amp_dtype=None
) -> Trainer:
    spec = FeatureSpec.from_yaml(dataset)
    model_cfg = DLRMConfig(  # without the linear term: these tests pin the model (it has tests of its own)
        len(spec.numerical_features),
        tuple(spec.cardinalities),
        embedding_dim=8,
        bottom_mlp=(32, 8),
        top_mlp=(32, 1),
        linear=False,
    )
    torch.manual_seed(cfg.seed)
    model = create_model("dlrm", model_cfg)
    return trainer_of(
        model,
        RunInfo("dlrm", model_cfg, spec.summary()),
        TrainData(SplitBinaryDataset(spec, "train"), SplitBinaryDataset(spec, "test")),
        cfg,
        Placement(CPU, amp_dtype),
        RunOutputs(save, log, progress=False),
    )


def params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_short_run_learns_the_planted_signal(tiny_dataset, tmp_path):
    # plain SGD at DLRM's reference rate (the model's defaults are Adam's)
    cfg = TrainConfig(epochs=1, batch_size=128, optimizer="sgd", lr=1.0, embedding_optimizer="sgd", embedding_lr=1.0,
                      evals_per_epoch=2)  # fmt: skip
    trainer = build(tiny_dataset, cfg, log=tmp_path / "log.jsonl")
    test = SplitBinaryDataset(tiny_dataset, "test")
    before = evaluate(trainer.model, test, CPU)
    result = trainer.fit()
    # 21.6k rows, one epoch: well above chance and far better than the untrained model
    assert abs(before["auc"] - 0.5) < 0.06
    assert result["auc"] > 0.66 and result["logloss"] < before["logloss"] - 0.04, (before, result)
    assert result["samples"] == len(test) == 2400
    events = [__import__("json").loads(line)["event"] for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert events.count("eval") == 2 and events[0] == "start" and "train" in events


def test_training_is_deterministic_with_a_seed(tiny_dataset):
    a = build(tiny_dataset, TrainConfig(batch_size=256, max_steps=30, evals_per_epoch=0, seed=5))
    b = build(tiny_dataset, TrainConfig(batch_size=256, max_steps=30, evals_per_epoch=0, seed=5))
    a.fit()
    b.fit()
    for k, v in params(a.model).items():
        assert torch.equal(v, params(b.model)[k]), k


def test_resuming_reaches_the_same_parameters(tiny_dataset, tmp_path):
    # 2 epochs of 43 steps; stop at step 60 (mid second epoch), resume, finish: same as never stopping
    cfg = TrainConfig(batch_size=512, epochs=2, evals_per_epoch=0, seed=3)
    straight = build(tiny_dataset, cfg)
    straight.fit()

    first = build(tiny_dataset, TrainConfig(**{**cfg.to_dict(), "max_steps": 60}), save=tmp_path / "mid.pt")
    first.fit()
    ckpt = load_checkpoint(tmp_path / "mid.pt")
    assert (ckpt.step, ckpt.epoch, ckpt.batch_in_epoch) == (60, 1, 60 - straight.steps_per_epoch)

    resumed = build(tiny_dataset, cfg)
    resumed.store.restore(ckpt)
    resumed.fit()
    assert resumed.step == straight.step == 2 * straight.steps_per_epoch
    for k, v in params(straight.model).items():
        torch.testing.assert_close(params(resumed.model)[k], v, rtol=0, atol=0, msg=k)
    # and the partial run really was different from the end state
    assert not torch.equal(ckpt.build_model().embeddings.onehot.weight, straight.model.embeddings.onehot.weight)


def test_checkpoint_round_trip_and_atomic_write(tiny_dataset, tmp_path):
    t = build(tiny_dataset, TrainConfig(batch_size=1024, max_steps=5, evals_per_epoch=0), save=tmp_path / "c.pt")
    t.fit()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]  # no temp file left
    ckpt = load_checkpoint(tmp_path / "c.pt")
    model = ckpt.build_model()
    test = SplitBinaryDataset(tiny_dataset, "test")
    assert evaluate(model, test, CPU) == evaluate(t.model, test, CPU)
    assert ckpt.train_config["max_steps"] == 5 and ckpt.model_name == "dlrm"


def test_checkpoint_from_a_different_spec_is_refused(tiny_dataset, tmp_path):
    t = build(tiny_dataset, TrainConfig(batch_size=1024, max_steps=1, evals_per_epoch=0), save=tmp_path / "c.pt")
    t.fit()
    ckpt = load_checkpoint(tmp_path / "c.pt")
    summary = FeatureSpec.from_yaml(tiny_dataset).summary()
    summary["cardinalities"][2] += 1
    with pytest.raises(CheckpointError, match="feature 'cat_2.bin' has cardinality 51 in other but 50"):
        ckpt.check_spec(summary, "other")


def test_unreadable_checkpoints(tmp_path):
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="junk.pt: not a readable ctrkit checkpoint"):
        load_checkpoint(tmp_path / "junk.pt")
    with pytest.raises(CheckpointError, match="checkpoint not found"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a ctrkit checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


def test_bf16_autocast_trains(tiny_dataset):
    t = build(tiny_dataset, TrainConfig(batch_size=256, max_steps=40, evals_per_epoch=0), amp_dtype=torch.bfloat16)
    result = t.fit()
    assert result["auc"] > 0.6 and np.isfinite(result["logloss"])


def test_divergence_is_reported(tiny_dataset):
    t = build(
        tiny_dataset,
        TrainConfig(
            batch_size=256,
            max_steps=40,
            optimizer="sgd",
            lr=1e6,
            embedding_optimizer="sgd",
            embedding_lr=1e6,
            warmup_steps=0,
            print_freq=10,
            evals_per_epoch=0,
        ),  # fmt: skip
    )
    with pytest.raises(FloatingPointError, match="lower the learning rate"):
        t.fit()


def test_default_schedule_is_derived_from_the_run_length():
    cfg, rules = resolved_train(TrainConfig(lr=2.0, epochs=1), 1000)
    s = schedule_of(cfg, 1000)
    assert (s.warmup_steps, s.decay_start_step, s.decay_steps) == (50, 500, 500)
    assert s(999) < 0.01 and s(600) < 2.0 and s(300) == 2.0
    assert rules["decay_steps"] == "the last 50% of the planned steps"
    # with epochs as a maximum (10 here), the warmup follows the first epoch, the decay the whole run
    cfg, _ = resolved_train(TrainConfig(lr=2.0, epochs=10), 100)
    s = schedule_of(cfg, 1000)
    assert (s.warmup_steps, s.decay_start_step, s.decay_steps) == (5, 500, 500) and s(5) == 2.0
    given, rules = resolved_train(TrainConfig(lr=2.0, epochs=10, decay_steps=0, warmup_steps=7), 100)
    assert (given.warmup_steps, given.decay_steps, given.decay_start_step) == (7, 0, 1000)
    assert "warmup_steps" not in rules


def test_train_config_validation():
    with pytest.raises(ValueError, match="`batch_size`: expected an integer from 1 to 2147483647, got 0"):
        TrainConfig(batch_size=0).validate()
    with pytest.raises(ValueError, match="end_lr"):
        TrainConfig(lr=1.0, end_lr=2.0).validate()
    with pytest.raises(ValueError, match="`reinit_embeddings`: expected one of auto, on, off, got True"):
        TrainConfig(reinit_embeddings=True).validate()
    with pytest.raises(ValueError, match="`reinit_drop`"):
        TrainConfig(reinit_drop=-0.1).validate()


def test_oracle_reference_for_the_tiny_data():
    # sanity of the reference used above: the planted odds give AUC well above what the test requires
    model = SyntheticCTR((3, 10, 50, 120, 400, 2000, 7, 900), 4, seed=7)
    block = model.sample(np.random.default_rng(0), 20_000)
    assert roc_auc(block.labels, block.logits) > 0.8


class _NotATensor:
    pass


def test_checkpoint_with_pickled_objects_is_refused(tmp_path):
    from ctrkit.checkpoint import FORMAT, VERSION

    torch.save({"format": FORMAT, "version": VERSION, "payload": _NotATensor()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="evil.pt: not a readable ctrkit checkpoint"):
        load_checkpoint(tmp_path / "evil.pt")


@pytest.mark.parametrize("dense_opt, emb_opt", [("adam", "rowwise_adagrad"), ("adagrad", "adam")])
def test_other_optimizers_train_and_resume_exactly(tiny_dataset, tmp_path, dense_opt, emb_opt):
    cfg = TrainConfig(
        batch_size=512,
        max_steps=30,
        evals_per_epoch=0,
        optimizer=dense_opt,
        lr=1e-3,
        embedding_optimizer=emb_opt,
        embedding_lr=0.05,
    )
    straight = build(tiny_dataset, cfg)
    result = straight.fit()
    assert result["auc"] > 0.6
    first = build(tiny_dataset, TrainConfig(**{**cfg.to_dict(), "max_steps": 13}), save=tmp_path / "c.pt")
    first.fit()
    resumed = build(tiny_dataset, cfg)
    resumed.store.restore(load_checkpoint(tmp_path / "c.pt"))
    resumed.fit()
    for k, v in params(straight.model).items():
        torch.testing.assert_close(params(resumed.model)[k], v, rtol=0, atol=0, msg=k)
    other = build(tiny_dataset, TrainConfig(**{**cfg.to_dict(), "embedding_optimizer": "sgd"}))
    with pytest.raises(ValueError, match="resume with the same optimizer, embedding_optimizer and wide_optimizer"):
        other.store.restore(load_checkpoint(tmp_path / "c.pt"))


def _tiny_step(compile: bool):
    from ctrkit.train.optim import build_optimizers
    from ctrkit.train.step import TrainStep

    torch.manual_seed(0)
    cfg = DLRMConfig(3, (5, 7), embedding_dim=4, bottom_mlp=(8, 4), top_mlp=(8, 1), linear=False)
    model = create_model("dlrm", cfg)
    step = TrainStep(model, build_optimizers(model, "sgd", 0.1, "sgd", 0.1), CPU, compile=compile)
    return model, step


def _tiny_batches():
    from ctrkit.data.batch import Batch

    g = torch.Generator().manual_seed(1)
    return [
        Batch(
            torch.randn(32, 3, generator=g),
            torch.stack([torch.randint(0, 5, (32,), generator=g), torch.randint(0, 7, (32,), generator=g)], 1),
            torch.randint(0, 2, (32,), generator=g).float(),
        )
        for _ in range(4)
    ]


def test_compiled_training_matches_eager():
    # a fresh compile cache: after the serving tests' compiles of the same forward code (no grad, dynamic
    # sizes), dynamo recompiles it with symbolic sizes, which gather's out= variant does not support, and
    # training falls back to eager (with a warning): a process that serves and then trains with --compile
    torch._dynamo.reset()
    eager_model, eager = _tiny_step(False)
    compiled_model, compiled = _tiny_step(True)
    for batch in _tiny_batches():
        torch.testing.assert_close(compiled(batch), eager(batch), rtol=1e-4, atol=1e-5)
    assert compiled.forward is not compiled_model  # really compiled, not fallen back
    torch.testing.assert_close(compiled_model.top_mlp[0].weight, eager_model.top_mlp[0].weight, rtol=1e-4, atol=1e-5)


def test_compile_failure_falls_back_to_eager(monkeypatch):
    def broken_compile(model):
        def run(*args):
            raise RuntimeError("no C++ compiler found\nmore detail")

        return run

    monkeypatch.setattr(torch, "compile", broken_compile)
    model, step = _tiny_step(True)
    with pytest.warns(UserWarning, match=r"torch.compile failed \(RuntimeError: no C\+\+ compiler found\); training"):
        loss = step(_tiny_batches()[0])
    assert torch.isfinite(loss) and step.forward is model


def test_a_compiled_backward_that_fails_falls_back_and_retakes_the_step(monkeypatch):
    """A backend that compiles the forward but fails on the backward (built at the first backward: inductor
    refused the sparse gradients of DCNv2's tables there once) makes the step fall back to eager and take the
    step again: the weights after it equal an eager step's."""

    class _FailingBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError("Cannot access storage of SparseTensorImpl\nmore detail")

    def compile_forward_only(model):
        return lambda *args: _FailingBackward.apply(model(*args))

    eager_model, eager = _tiny_step(False)
    monkeypatch.setattr(torch, "compile", compile_forward_only)
    model, step = _tiny_step(True)
    batch = _tiny_batches()[0]
    with pytest.warns(UserWarning, match=r"torch.compile failed \(NotImplementedError: Cannot access storage"):
        loss = step(batch)
    assert step.forward is model
    torch.testing.assert_close(loss, eager(batch), rtol=0, atol=0)
    for (name, p), q in zip(model.named_parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    "name, shape",
    [
        ("dlrm", {"bottom_mlp": (16, 8), "top_mlp": (16, 1)}),
        ("dcnv2", {"bottom_mlp": (16, 8), "top_mlp": (16, 8, 1), "structure": "parallel", "cross_projection_dim": 4}),
        ("wide_deep", {"deep_mlp": (16,)}),
    ],
)
def test_every_model_round_trips_through_a_checkpoint(tiny_dataset, tmp_path, name, shape):
    from ctrkit.models.registry import make_config

    spec = FeatureSpec.from_yaml(tiny_dataset)
    config = make_config(name, {"num_numerical": 4, "cardinalities": spec.cardinalities, "embedding_dim": 8, **shape})
    torch.manual_seed(0)
    model = create_model(name, config)
    trainer = trainer_of(
        model,
        RunInfo(name, config, spec.summary()),
        TrainData(SplitBinaryDataset(spec, "train")),
        TrainConfig(max_steps=5, evals_per_epoch=0),
        Placement(CPU),
        RunOutputs(save_path=tmp_path / "m.pt", progress=False),
    )
    trainer.fit()
    loaded = load_checkpoint(tmp_path / "m.pt").build_model()
    assert type(loaded) is type(model) and loaded.config == model.config
    test = SplitBinaryDataset(spec, "test")
    assert evaluate(loaded, test, CPU) == evaluate(model, test, CPU)


def _untouched_rows(dataset: Path, cardinalities) -> list[np.ndarray]:
    """Per feature, the ids that no 'train' row holds: training never updates them."""
    data = SplitBinaryDataset(dataset, "train")
    cats = data.slice(0, len(data)).categorical.numpy()
    return [np.setdiff1d(np.arange(c), cats[:, f]) for f, c in enumerate(cardinalities)]


@pytest.mark.parametrize("reinit", [True, False])
def test_reinit_embeddings_redraws_the_tables_at_each_epoch(tiny_dataset, reinit):
    cfg = TrainConfig(batch_size=512, epochs=3, evals_per_epoch=0, seed=3, reinit_embeddings="on" if reinit else "off")
    trainer = build(tiny_dataset, cfg)
    tables = trainer.model.embeddings.onehot
    trainer.fit()
    assert trainer.step == 3 * trainer.steps_per_epoch
    untouched = _untouched_rows(tiny_dataset, tables.cardinalities)
    assert sum(len(u) for u in untouched) > 50  # the check below has rows to look at
    for f, rows in enumerate(untouched):
        card = tables.cardinalities[f]
        drawn = {d: tables.init.fill(torch.empty(card, tables.dim), f, 0, card, draw=d) for d in (0, 2)}
        expected = drawn[2] if reinit else drawn[0]  # the third epoch's draw, or the initial table
        torch.testing.assert_close(tables.table(f).detach()[rows], expected[rows], rtol=0, atol=0)
        if len(rows):
            assert not torch.equal(drawn[0][rows], drawn[2][rows])
    # the tables' optimizer state restarted with the last epoch's draw (lazy Adam counts its own steps)
    state = [opt.state[tables.weight] for opt in trainer.optimizers if tables.weight in opt.state]
    assert len(state) == 1 and state[0]["step"] == (1 if reinit else 3) * trainer.steps_per_epoch


def test_resuming_at_an_epoch_boundary_redraws_the_tables_as_the_uninterrupted_run(tiny_dataset, tmp_path):
    # no validation: the last weights are kept, so they show whether the resumed run redrew its tables
    cfg = TrainConfig(batch_size=512, epochs=2, evals_per_epoch=0, validation_fraction=0.0, seed=4,
                      reinit_embeddings="on")  # fmt: skip
    straight = build(tiny_dataset, cfg)
    straight.fit()
    spe = straight.steps_per_epoch
    build(tiny_dataset, TrainConfig(**{**cfg.to_dict(), "max_steps": spe}), save=tmp_path / "epoch1.pt").fit()
    ckpt = load_checkpoint(tmp_path / "epoch1.pt")
    assert (ckpt.step, ckpt.epoch, ckpt.batch_in_epoch) == (spe, 1, 0)
    resumed = build(tiny_dataset, cfg)
    resumed.store.restore(ckpt)
    resumed.fit()
    for k, v in params(straight.model).items():
        torch.testing.assert_close(params(resumed.model)[k], v, rtol=0, atol=0, msg=k)


@pytest.mark.parametrize("fall_at", [2, 3, None])
def test_auto_reinit_starts_when_validation_falls_after_the_first_epoch(tiny_dataset, tmp_path, fall_at):
    from tests.train.test_selection import PlantedValidation

    cfg = TrainConfig(batch_size=512, epochs=3, evals_per_epoch=2, early_stopping_patience=0, plateau_patience=0,
                      seed=2)  # fmt: skip
    assert cfg.reinit_embeddings == "auto" and cfg.reinit_drop == 0.01  # the defaults
    trainer = build(tiny_dataset, cfg, log=tmp_path / "log.jsonl")
    tables = trainer.model.embeddings.onehot
    # evaluations at 0.5, 1, 1.5, 2, ... epochs; one of them (half-way through epoch 2, or at its end) falls
    # 0.05 below the best, or none falls more than 0.005
    curve = [0.70, 0.75, 0.755, 0.76, 0.77, 0.78, 0.79]
    if fall_at is not None:
        curve[fall_at] = 0.70
    planted = PlantedValidation(trainer, curve)
    at_redraw = {}
    real_reinit = trainer.reinit_embeddings

    def reinit(epoch):
        at_redraw[trainer.step] = params(trainer.model)
        real_reinit(epoch)

    trainer.reinit_embeddings = reinit
    trainer.fit()
    spe = trainer.steps_per_epoch
    events = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    redraws = [r["step"] for r in events if r["event"] == "reinit_embeddings"]
    steps = sorted(trainer.eval_steps())
    # at an epoch's end the redraw is the next epoch's, once
    assert redraws == {2: [steps[2], 2 * spe], 3: [2 * spe], None: []}[fall_at]
    if fall_at is not None:  # the run went on from the best weights with fresh tables, not the fallen ones
        best_step = steps[fall_at - 1]
        restored, best, fallen = at_redraw[steps[fall_at]], planted.states[best_step], planted.states[steps[fall_at]]
        for k, v in best.items():  # taken just before the redraw: every weight, tables included, the best's
            torch.testing.assert_close(restored[k], v, rtol=0, atol=0, msg=k)
        assert any(not torch.equal(fallen[k], v) for k, v in best.items())
    untouched = _untouched_rows(tiny_dataset, tables.cardinalities)
    for f, rows in enumerate(untouched):  # the last epoch's draw (2), or the initial table
        card = tables.cardinalities[f]
        want = tables.init.fill(torch.empty(card, tables.dim), f, 0, card, draw=0 if fall_at is None else 2)
        torch.testing.assert_close(tables.table(f).detach()[rows], want[rows], rtol=0, atol=0)


def test_a_trainer_trains_decided_settings_and_decides_none(tiny_dataset):
    """The plan decides a run's settings (``run.settled`` for a Trainer built by hand); a Trainer given undecided
    ones refuses them, naming them, rather than deciding them a second time."""
    spec = FeatureSpec.from_yaml(tiny_dataset)
    model_cfg = DLRMConfig(4, tuple(spec.cardinalities), embedding_dim=8, bottom_mlp=(32, 8), top_mlp=(32, 1))
    model, info = create_model("dlrm", model_cfg), RunInfo("dlrm", model_cfg, spec.summary())
    data = TrainData(SplitBinaryDataset(spec, "train"))
    with pytest.raises(ValueError, match="lr, embedding_optimizer, embedding_lr, batch_size.*are not: a Run's plan"):
        Trainer(model, info, data, TrainConfig(optimizer="adam"), Placement(CPU))
    cfg, held = settled(TrainConfig(max_steps=2), "dlrm", data)
    assert all(getattr(cfg, k) is not None for k in DECIDED)
    assert len(held.validation) + len(held.train) == len(data.train)  # the validation rows held out of train
    assert Trainer(model, info, held, cfg, Placement(CPU), RunOutputs(progress=False)).fit()["step"] == 2
