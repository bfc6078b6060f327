"""Forks and budgets from one trunk (train.fork_from, train.ckpt_steps), weights alone (train.init_from),
and what each refuses (docs/training.md#forks-budgets-from-one-trunk-continued-pretraining)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_reliability import flip_a_weight_bit
from train_helpers import assert_one_line, compose, run_cli, tiny_overrides

import mars.checkpoint as ckpt
from mars.checkpoint.checksums import file_digest
from mars.checkpoint.lineage import read_lineage
from mars.train.config import ScheduleConfig
from mars.train.distributed import DistInfo
from mars.train.rundir import choose_start
from mars.train.schedule import LRSchedule, decay_start
from mars.train.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread", "restore_logging")

LLAMA = ["model=llama_tiny", "model.n_head=4", "model.n_kv_head=2"]
WSD = ["schedule=wsd", "schedule.decay_fraction=0.25"]  # warmup 2 (tiny_overrides)
MUP = ["model.parametrization=mup", "model.mup_base_width=16"]  # width 32: m = 2 (docs/mup.md)
TIMING = {"time", "train_time", "ms_per_step", "ms_forward_backward", "ms_optimizer", "tokens_per_s", "mfu"}
TIMING.add("hardware")  # what the seconds were measured on: said again by each run segment


def lines(run_dir: Path) -> list[dict]:
    records = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def test_decay_start_is_where_runs_of_every_length_part():
    """Before decay_start(B), a wsd run of B steps and any longer one have the same lr factor, at every
    rounding of the decay's start; at decay_start(B) (or the step after, when the start is whole) B's
    run has begun to decay."""
    for fraction in (0.1, 0.2, 0.25, 1 / 3):
        cfg = ScheduleConfig(name="wsd", warmup_steps=3, decay_fraction=fraction)
        for budget in range(5, 40):
            start = decay_start(budget, cfg)
            short = LRSchedule.from_config(cfg, 1.0, budget)
            for longer in (budget + 1, budget + 7, 4 * budget):
                long = LRSchedule.from_config(cfg, 1.0, longer)
                assert [short(s) for s in range(start)] == [long(s) for s in range(start)]
            assert short(start + 1) < 1.0 and start <= budget
    assert decay_start(100, ScheduleConfig(name="cosine", warmup_steps=10)) == 10


@pytest.mark.parametrize("model", [[], LLAMA, MUP], ids=["gpt2", "llama", "gpt2-mup"])
def test_a_budget_branch_equals_the_standalone_run_bit_for_bit(data_root, tmp_path, model):
    """A wsd trunk of 12 steps saves at the decay start of an 8-step budget (train.ckpt_steps); the fork
    from there with train.max_steps=8 logs what a standalone 8-step run logs (every train/loss,
    grad_norm, lr and val/loss; the log window of the trunk's last line carries over) and ends with the
    same weights, bit for bit."""

    def cfg(max_steps, *extra):
        overrides = tiny_overrides(
            data_root, max_steps=max_steps, eval_interval=4, log_interval=3, keep_last=1
        )
        return compose([*overrides, *WSD, *model, *extra])

    start = decay_start(8, cfg(8).schedule)
    assert start == 7  # 8 - 0.25 x (8 - 2) = 6.5, rounded up
    trunk, branch, alone = tmp_path / "trunk", tmp_path / "branch", tmp_path / "alone"
    Trainer(cfg(12, f"train.ckpt_steps=[{start}]"), trunk, DistInfo()).fit()
    kept = [p.name for p in ckpt.list_checkpoints(trunk / "ckpt")]
    assert kept == ["step_00000007", "step_00000012"]  # keep_last=1, and the ckpt_steps one stays

    fork = cfg(8, f"train.fork_from={trunk / 'ckpt' / 'step_00000007'}")
    forked = Trainer(fork, branch, DistInfo(), resume_from=choose_start(fork, branch, 1))
    forked.fit()
    standalone = Trainer(cfg(8), alone, DistInfo())
    standalone.fit()

    assert [r["step"] for r in lines(branch)] == [8, 8]  # only its own steps (the train line, val/loss)
    got = [r for r in lines(trunk) if r["step"] <= start] + lines(branch)
    assert got == lines(alone)
    ours, theirs = forked.raw_model.state_dict(), standalone.raw_model.state_dict()
    assert all(torch.equal(w, theirs[k]) for k, w in ours.items())

    record = read_lineage(branch)
    assert record["kind"] == "fork" and record["step"] == start
    assert record["parent_run_dir"] == str(trunk.resolve())
    parent = trunk / "ckpt" / "step_00000007"
    assert record["checksums"] == {"checksums.json": file_digest(parent / "checksums.json")}


@pytest.fixture
def trunk(data_root, tmp_path) -> Path:
    """A 4-step run with checkpoints at steps 2 and 4."""
    run = tmp_path / "trunk"
    Trainer(compose(tiny_overrides(data_root, max_steps=4, ckpt_interval=2)), run, DistInfo()).fit()
    return run


def test_a_fork_requeued_with_resume_auto_continues_itself(monkeypatch, capsys, tmp_path, data_root, trunk):
    branch = tmp_path / "branch"
    step2 = trunk / "ckpt" / "step_00000002"
    args = [f"train.fork_from={step2}", "train.resume=auto", f"hydra.run.dir={branch}"]
    code, out, err = run_cli(monkeypatch, capsys, [*tiny_overrides(data_root, max_steps=3), *args])
    assert code == 0, err
    assert f"starting the fork from {step2}" in out
    assert [r["step"] for r in lines(branch)] == [3, 3]
    first = (branch / "lineage.json").read_text()
    assert json.loads(first)["step"] == 2

    # the same command again (a requeued job), a longer budget: it continues its own checkpoint
    code, out, err = run_cli(monkeypatch, capsys, [*tiny_overrides(data_root, max_steps=5), *args])
    assert code == 0, err
    assert "continuing from" in out and str(branch / "ckpt" / "step_00000003") in out
    assert [r["step"] for r in lines(branch)] == [3, 3, 4, 5, 5]
    assert (branch / "lineage.json").read_text() == first  # it still forked from the trunk's step 2


def test_resume_from_another_run_dirs_checkpoint_is_a_fork_of_it(
    monkeypatch, capsys, tmp_path, data_root, trunk
):
    """train.resume=PATH naming another run dir's checkpoint makes a new run, as train.fork_from does: it
    records its lineage (reports draw the parent's curve) and logs to a wandb run of its own, instead of
    a run dir whose curve starts mid-way from nowhere and a wandb run shared with its parent."""
    step2, new = trunk / "ckpt" / "step_00000002", tmp_path / "continued"
    before = sorted(p.name for p in (trunk / "ckpt").iterdir())
    args = [f"train.resume={step2}", f"hydra.run.dir={new}"]
    code, out, err = run_cli(monkeypatch, capsys, [*tiny_overrides(data_root, max_steps=3), *args])
    assert code == 0, err
    assert f"forked from {step2} at step 2 (train.resume names another run dir's)" in out
    record = read_lineage(new)
    assert (record["kind"], record["step"], record["parent_run_dir"]) == ("fork", 2, str(trunk.resolve()))
    assert [r["step"] for r in lines(new)] == [3, 3]
    assert sorted(p.name for p in (trunk / "ckpt").iterdir()) == before  # the parent is left as it was


def test_what_a_fork_refuses(monkeypatch, capsys, tmp_path, data_root, trunk):
    step2, step4 = trunk / "ckpt" / "step_00000002", trunk / "ckpt" / "step_00000004"

    def fork(source, *extra, run_dir=tmp_path / "branch"):
        args = [
            *tiny_overrides(data_root, max_steps=6),
            f"train.fork_from={source}",
            f"hydra.run.dir={run_dir}",
        ]
        return run_cli(monkeypatch, capsys, [*args, *extra])

    code, _, err = fork(step2, run_dir=trunk)  # into a run dir that holds a run
    assert code == 1
    assert_one_line(err, f"run dir {trunk} already holds a run", "train.overwrite=true")

    code, _, err = fork(step2, "train.seed=7")
    assert code == 2
    assert_one_line(
        err, f"train.fork_from={step2}", "train.seed: 1337 -> 7", "config.yaml", "train.seed=1337"
    )

    code, _, err = fork(step2, "model.n_embd=64")  # exit 2 like the seed, and like train.resume=PATH
    assert code == 2
    assert_one_line(err, f"{step2 / 'model.json'} holds another model", "model.n_embd=32 (config: 64)")

    code, _, err = fork(step2, "train.resume=" + str(step2))
    assert code == 2
    assert_one_line(err, "train.fork_from=", "train.resume=", "drop train.resume")

    code, _, err = fork(step2, "train.ckpt_steps=[3,9]")
    assert code == 2
    assert_one_line(err, "train.ckpt_steps=[3, 9]: 9 is not a step of this run", "train.max_steps=6")

    ckpt.update_meta(step4, healthy=False)
    code, _, err = fork(trunk)  # a run dir: its newest checkpoint
    assert code == 1
    assert_one_line(err, f"train.fork_from={trunk}: {step4} is marked unhealthy")

    flip_a_weight_bit(step2 / "model.safetensors")
    code, _, err = fork(step2)
    assert code == 1
    assert_one_line(err, f"train.fork_from={step2}: {step2 / 'model.safetensors'}: its bytes do not match")
    assert not (tmp_path / "branch").exists()  # every refusal came before Hydra made the run dir


def test_init_from_a_run_takes_its_weights_alone(data_root, tmp_path, trunk):
    cfg = compose([*tiny_overrides(data_root, max_steps=2), f"train.init_from={trunk}", "train.seed=5"])
    tr = Trainer(cfg, tmp_path / "cont", DistInfo(), resume_from=choose_start(cfg, tmp_path / "cont", 1))
    parent, _ = ckpt.load_model(trunk)
    assert tr.state.step == 0 and not tr.optimizer.state
    assert all(torch.equal(w, parent.state_dict()[k]) for k, w in tr.raw_model.state_dict().items())
    tr.fit()
    assert read_lineage(tmp_path / "cont")["kind"] == "init"
    assert read_lineage(tmp_path / "cont")["parent_checkpoint"] == str(
        (trunk / "ckpt" / "step_00000004").resolve()
    )


def hf_dir(family: str, path: Path, vocab: int = 50304) -> Path:
    """A tiny transformers-made model directory of the shape TINY_MODEL (+ LLAMA) gives (GPT-2: with
    `vocab` rows; 50257 is GPT-2's own)."""
    import transformers

    torch.manual_seed(0)
    if family == "gpt2":
        config = transformers.GPT2Config(
            vocab_size=vocab, n_positions=32, n_embd=32, n_layer=1, n_head=2, bos_token_id=50256,
            eos_token_id=50256, scale_attn_by_inverse_layer_idx=True,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(config)
        with torch.no_grad():  # non-zero biases and LayerNorm shifts: they must come across too
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.add_(torch.randn_like(p) * 0.1)
    else:
        config = transformers.LlamaConfig(
            vocab_size=50304, hidden_size=32, intermediate_size=128, num_hidden_layers=1,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, rms_norm_eps=1e-5,
            tie_word_embeddings=False,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "family, model, vocab",
    [
        ("gpt2", ["model.bias=true"], 50304),
        ("gpt2", ["model.bias=true"], 50257),  # GPT-2's own vocabulary: the 47 padding rows masked out
        ("llama", [*LLAMA, "model.mlp_hidden=128"], 50304),
    ],
    ids=["gpt2", "gpt2-50257", "llama"],
)
def test_init_from_a_hugging_face_directory(monkeypatch, capsys, data_root, tmp_path, family, model, vocab):
    """The first step's loss is the HF model's loss on that batch (a transformers GPT-2 with 50257 rows
    too: the rows model.vocab_size=50304 adds are out of the softmax), and training goes on from there."""
    import transformers

    source = hf_dir(family, tmp_path / "hf", vocab)
    overrides = [*tiny_overrides(data_root, max_steps=3), *model, f"train.init_from={source}"]
    tr = Trainer(compose(overrides), tmp_path / "run", DistInfo())
    hf = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
    with torch.no_grad():
        batch = tr.loader.get(0)
        want = sum(
            torch.nn.functional.cross_entropy(hf(x).logits.flatten(0, 1), y.flatten()).item()
            for x, y in batch
        ) / len(batch)
    tr.fit()
    losses = {r["step"]: r["train/loss"] for r in lines(tmp_path / "run") if "train/loss" in r}
    assert losses[1] == pytest.approx(want, rel=1e-5)  # step 1's line: the loss of batch 0 at the HF weights
    if vocab < 50304:  # the checkpoints keep the mask, and an export is the transformers model's shape
        saved = json.loads((tmp_path / "run" / "ckpt" / "step_00000003" / "model.json").read_text())
        assert saved["live_vocab_size"] == vocab
    assert all(map(torch.isfinite, map(torch.tensor, losses.values()))) and len(set(losses.values())) == 3
    record = read_lineage(tmp_path / "run")
    assert record["kind"] == "init" and record["format"] == "hf" and "config.json" in record["checksums"]

    wrong = [*overrides, "model.n_layer=2", f"hydra.run.dir={tmp_path / 'wrong'}"]
    capsys.readouterr()
    code, _, err = run_cli(monkeypatch, capsys, wrong)
    assert code == 2
    assert_one_line(
        err,
        f"train.init_from={source}: {source / 'config.json'} holds another model",
        "model.n_layer=1 (config: 2)",
    )


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_the_init_from_check_reads_the_config_not_the_model(monkeypatch, tmp_path, family):
    """train.init_from=HF_DIR is checked from config.json (and GPT-2's bias tensors) before the run dir
    exists; the model is loaded once, by the trainer, not a second time for the check. The config the
    check finds is the one the full import gives, from safetensors and from pytorch_model.bin alike."""
    import transformers

    from mars.train.forks import hf_model_config, load_hf

    source = hf_dir(family, tmp_path / "hf")
    whole = load_hf(source).config
    bin_dir = tmp_path / "bin"  # the older format: a torch.save'd state dict (transformers 5 writes none)
    bin_dir.mkdir()
    shutil.copy(source / "config.json", bin_dir / "config.json")
    hf_state = transformers.AutoModelForCausalLM.from_pretrained(source).state_dict()
    torch.save(hf_state, bin_dir / "pytorch_model.bin")
    assert load_hf(bin_dir).config == whole

    def no_model(*args, **kwargs):
        raise AssertionError("the check loaded the whole model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_model)
    assert hf_model_config(source) == whole
    assert hf_model_config(bin_dir) == whole
    if family == "gpt2":  # biases all zero (what an export of a bias=False model writes): bias=False
        assert whole.bias
        zero = transformers.GPT2LMHeadModel(transformers.AutoConfig.from_pretrained(source))
        with torch.no_grad():
            for name, param in zero.named_parameters():
                if name.endswith(".bias"):
                    param.zero_()
        zero.save_pretrained(tmp_path / "zero")
        assert hf_model_config(tmp_path / "zero").bias is False


@pytest.mark.slow
@pytest.mark.extended  # CI: the same in one process (above) and fsdp's resharded state (test_average.py)
@pytest.mark.parametrize("model", [pytest.param([], id="gpt2"), pytest.param(LLAMA, id="llama")])
def test_a_budget_branch_on_two_fsdp_ranks_equals_the_standalone_run(data_root, tmp_path, model):
    """The same as in one process, under train.parallel=fsdp on 2 ranks (sharded checkpoints)."""
    from test_e2e import TRAIN, final_weights, run
    from test_fsdp import torchrun

    def train(run_dir, max_steps, *extra):
        overrides = tiny_overrides(
            data_root, max_steps=max_steps, batch_size=1, global_batch_size=4, eval_steps=4, eval_interval=3
        )
        args = [*overrides, *model, *WSD, "train.parallel=fsdp", *extra, f"hydra.run.dir={run_dir}"]
        run(torchrun(2, TRAIN, *args), tmp_path)

    start = decay_start(6, compose([*tiny_overrides(data_root, max_steps=6), *WSD]).schedule)
    trunk, branch, alone = tmp_path / "trunk", tmp_path / "branch", tmp_path / "alone"
    train(trunk, 8, f"train.ckpt_steps=[{start}]")
    parent = trunk / "ckpt" / ckpt.step_dirname(start)
    assert ckpt.read_meta(parent)["format"] == "sharded"
    train(branch, 6, f"train.fork_from={parent}")
    train(alone, 6)
    assert [r for r in lines(trunk) if r["step"] <= start] + lines(branch) == lines(alone)
    (ours, _), (theirs, _) = final_weights(branch), final_weights(alone)
    assert all(torch.equal(w, theirs[k]) for k, w in ours.items())
    assert read_lineage(branch)["step"] == start


def test_reports_and_plots_show_a_forks_lineage(monkeypatch, capsys, tmp_path, data_root, trunk):
    """Branches of one trunk at two budgets stay two runs (each its own setting, none an 'extended' run of
    another); the run table names each one's parent and step, and the plot draws the parent's curve up to
    the fork."""
    from mars.analysis.groups import at_sweep_length, group_runs
    from mars.analysis.plots import curves_figure
    from mars.analysis.runs import load_run, load_runs

    sweep = tmp_path / "branches"
    for budget in (3, 4):
        args = [f"train.fork_from={trunk / 'ckpt' / 'step_00000002'}", "train.resume=auto"]
        args += [f"hydra.run.dir={sweep / str(budget)}"]
        code, _, err = run_cli(monkeypatch, capsys, [*tiny_overrides(data_root, max_steps=budget), *args])
        assert code == 0, err
    runs, notes = at_sweep_length(load_runs([sweep]))
    assert not notes and [len(g.runs) for g in group_runs(runs)] == [1, 1]
    assert [r.lineage_line() for r in runs] == [
        f"{sweep / str(b)}: fork of {trunk.resolve()} at step 2" for b in (3, 4)
    ]
    assert runs[0].parent_points("train/loss") == [
        (p.tokens, p.seconds, p.value) for p in load_run(trunk).metrics["train/loss"][:2]
    ]
    figure = curves_figure(runs)
    # per run: its own curve, the parent's up to the fork and the fork mark (train loss, tokens axis)
    assert len(figure.axes[0].lines) == 3 * len(runs)


class _Payload:
    """What a hostile pytorch_model.bin may hold: unpickling it would run print."""

    def __reduce__(self):
        return (print, ("UNPICKLED AND RAN",))


@pytest.mark.parametrize("damage", ["cut short", "other weights", "other config", "pickled code"])
def test_an_hf_dir_whose_weights_cannot_be_what_it_says_is_one_line_before_the_run_dir(
    monkeypatch, capsys, data_root, tmp_path, damage
):
    """Weights cut short, weights of another model, a config.json of another model, or a weights file
    holding more than tensors: one line naming the file, before Hydra makes the run dir, nothing run."""
    import transformers

    source = hf_dir("gpt2", tmp_path / "hf")
    weights = source / "model.safetensors"
    if damage == "cut short":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif damage == "other weights":  # a 2-layer model's weights under the 1-layer config.json
        config = transformers.AutoConfig.from_pretrained(source)
        config.n_layer = 2
        transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "two")
        shutil.copy(tmp_path / "two" / "model.safetensors", weights)
    elif damage == "other config":
        config = json.loads((source / "config.json").read_text())
        (source / "config.json").write_text(json.dumps({**config, "n_embd": 64}))
    else:
        weights.unlink()
        torch.save({"transformer.wte.weight": _Payload()}, source / "pytorch_model.bin")
    capsys.readouterr()  # transformers' own progress bars while the directory was written
    run_dir = tmp_path / "run"
    args = [
        *tiny_overrides(data_root, max_steps=2),
        "model.bias=true",
        "model.n_embd=64" if damage == "other config" else "model.n_embd=32",
    ]
    code, out, err = run_cli(
        monkeypatch, capsys, [*args, f"train.init_from={source}", f"hydra.run.dir={run_dir}"]
    )
    assert code == 1, err
    file = source / ("pytorch_model.bin" if damage == "pickled code" else "model.safetensors")
    fragment = {
        "cut short": "cannot be read",
        "other weights": "does not hold the model",
        "other config": "wte.weight has shape [50304, 32] there, [50304, 64] by config.json",
        "pickled code": "holds Python objects besides tensors",
    }[damage]
    assert_one_line(err, f"train.init_from={source}: {file}", fragment)
    assert "weights_only=False" not in err and "UNPICKLED AND RAN" not in out + err
    assert not run_dir.exists()


def test_init_from_a_runs_export_equals_init_from_the_run(data_root, tmp_path, trunk):
    """scripts/export_hf.py carries every row that enters the softmax (the trained padding rows too), so
    starting from the export is starting from the run: the same losses, step by step."""
    from mars.checkpoint.export import export_hf

    export = export_hf(trunk, tmp_path / "hf")
    runs = {}
    for name, source in (("run", trunk), ("export", export)):
        cfg = compose([*tiny_overrides(data_root, max_steps=3), f"train.init_from={source}"])
        Trainer(cfg, tmp_path / name, DistInfo()).fit()
        runs[name] = [r["train/loss"] for r in lines(tmp_path / name) if "train/loss" in r]
    assert len(runs["run"]) == 3
    assert runs["export"] == pytest.approx(runs["run"], abs=1e-6, rel=0)
