"""One seam to TRL: only ``trl_multiagent/trainer/grpo_seam.py`` names a private member of TRL's ``GRPOTrainer`` or of
the Trainer (every other upstream internal: tests/package/test_seams.py), and what the package computes in TRL's place
(the loss reduction per ``loss_type``, GRPO advantages) is TRL's own, checked against TRL's ``GRPOTrainer`` on fixed
tensors."""

from __future__ import annotations

import ast
import inspect
import itertools
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
import trl
from scripted import addition_dataset

from trl_multiagent.seams.trl import (
    GLOBAL_TOKEN_LOSSES,
    LOSS_TYPES,
    SEQUENCE_MEAN_LOSSES,
    TOKEN_MEAN_LOSSES,
    LossScale,
    aggregate_like_trl,
    batch_importance_sampling_ratio,
    entropy_bonus_like_trl,
)
from trl_multiagent.trainer.grpo_seam import GRPOSeam
from trl_multiagent.training.advantages import outcome_advantages
from trl_multiagent.training.loss_weights import chunk_correction, per_role_kl_loss, role_weights

PACKAGE = Path(__file__).resolve().parents[2] / "trl_multiagent"
SEAM = PACKAGE / "trainer" / "grpo_seam.py"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def trl_private_names() -> set[str]:
    """Every private member of ``GRPOTrainer`` and the Trainer: the class attributes (``dir``) and the instance
    attributes their classes' source files set or read on ``self`` (``_metrics``, ``_step``, ...)."""
    names = {n for cls in (trl.GRPOTrainer, transformers.Trainer) for n in dir(cls) if _is_private(n)}
    sources = {
        inspect.getsourcefile(cls)
        for cls in trl.GRPOTrainer.__mro__
        if cls.__module__.startswith(("trl.", "transformers."))
    }
    for source in sources:
        for node in ast.walk(ast.parse(Path(source).read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
                if _is_private(node.attr):
                    names.add(node.attr)
    return names


TRL_PRIVATE = trl_private_names()


def private_uses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every place ``source`` names a member in ``names``: an attribute (``x._metrics``), a method or
    class attribute a class defines (an override), or a string given to getattr / setattr / hasattr / delattr."""
    found = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in names:
            found.append((node.lineno, node.attr))
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in names:
                    found.append((item.lineno, item.name))
                targets = item.targets if isinstance(item, ast.Assign) else [getattr(item, "target", None)]
                for target in targets:
                    if isinstance(target, ast.Name) and target.id in names:
                        found.append((item.lineno, target.id))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) > 1:
                name = node.args[1]
                if isinstance(name, ast.Constant) and name.value in names:
                    found.append((node.lineno, name.value))
    return sorted(found)


def test_the_check_finds_reads_overrides_class_attributes_and_getattr():
    source = (
        "class T(GRPOSeam):\n"
        "    _tag_names = []\n"
        "    def _prepare_inputs(self, batch):\n"
        "        return trainer._metrics\n"
        "x = getattr(trainer, '_step')\n"
        "y = trainer.metrics, self._own_name\n"
    )
    names = {"_tag_names", "_prepare_inputs", "_metrics", "_step"}
    assert private_uses(source, names) == [(2, "_tag_names"), (3, "_prepare_inputs"), (4, "_metrics"), (5, "_step")]


def test_the_private_names_include_trls_instance_state():
    assert {"_metrics", "_logs", "_step", "_buffered_inputs", "_tokenizer", "_pending_metrics"} <= TRL_PRIVATE
    assert {"_prepare_inputs", "_clip_grad_norm", "_save", "_tag_names"} <= TRL_PRIVATE


def test_only_the_seam_names_a_trl_private_member():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != SEAM
        for line, name in private_uses(path.read_text(), TRL_PRIVATE)
    ]
    assert not offenders, (
        "Private members of TRL's GRPOTrainer / the Trainer named outside trl_multiagent/trainer/grpo_seam.py; reach "
        "them through a public method or property of GRPOSeam instead:\n" + "\n".join(offenders)
    )


# The seam's own private names: the hooks the trainer overrides instead of TRL's, and what reaches TRL's state.
SEAM_OWN = {
    "_loss_forwards",
    "_generates_itself",
    "_flush_reward_function_logs",
    "_generate_and_score",
    "_micro_step_inputs",
    "_logps_and_entropies",
    "_clip_gradients",
    "_step_grad_norm",
    "_saving_aside",
    "_write_checkpoint",
    "_restore_optimizer_and_scheduler",
    "_save_model_files",
    "_load_model_weights",
    "_accumulating",
    "_trl_loss",
    "_text_tokenizer",
    "_is_vision_language_model",
    "_micro_step",
    "_buffered_micro_batches",
    "_checkpoint_folder",
    "_unwrapped_for_generation",
    "_environment_instances",
    "_score_completions",
    "_record_metrics",
    "_record_completions",
    "_record_completion_column",
    "_leave_entropy_bonus_to_us",
}


def test_every_private_name_of_the_seam_is_trls_or_its_own():
    """A TRL release that renames a hook or an attribute the seam overrides or reads fails here, naming it, instead
    of the override silently no longer being called."""
    tree = ast.parse(SEAM.read_text())
    (seam_class,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "GRPOSeam"]
    named = {n.attr for n in ast.walk(seam_class) if isinstance(n, ast.Attribute) and _is_private(n.attr)}
    named |= {n.name for n in seam_class.body if isinstance(n, ast.FunctionDef) and _is_private(n.name)}
    named |= {t.id for n in seam_class.body if isinstance(n, ast.AnnAssign) for t in [n.target] if _is_private(t.id)}
    assert named - SEAM_OWN - TRL_PRIVATE == set()
    assert SEAM_OWN <= named  # each of our names is the seam's


def test_the_seam_adds_no_public_name_and_its_own_names_shadow_nothing_of_trl():
    """A subclassing user sees TRL's public API: the seam's hooks and state are private names of ours, none of them
    one TRL (or the Trainer) uses, so overriding one never replaces an upstream member by accident."""
    seam_public = {n for n in vars(GRPOSeam) if not n.startswith("_")}
    assert seam_public == set()
    assert SEAM_OWN & TRL_PRIVATE == set()


# ------------------------------------------------------------------------------------ identity with TRL's arithmetic
def trl_loss_types() -> list[str]:
    """The loss types TRL supports, as its GRPOConfig's ``loss_type`` help lists them."""
    help_text = trl.GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    supported = re.search(r"Supported values are (.*?)\.\s", help_text)
    assert supported, f"GRPOConfig.loss_type's help no longer lists its values: {help_text[:200]!r}"
    return re.findall(r"'(\w+)'", supported.group(1))


TRL_LOSS_TYPES = trl_loss_types()


def test_every_trl_loss_type_is_classified_once():
    ours = [*SEQUENCE_MEAN_LOSSES, *TOKEN_MEAN_LOSSES, *GLOBAL_TOKEN_LOSSES]
    assert sorted(ours) == sorted(LOSS_TYPES) == sorted(TRL_LOSS_TYPES) and len(set(ours)) == len(ours)


def test_a_loss_type_trl_does_not_list_is_refused_not_guessed():
    """An unknown type was once balanced as token-level by `role_weights`; each place that reads it now refuses."""
    scale = LossScale(
        gradient_accumulation_steps=1, max_completion_length=5, num_processes=1, steps_per_generation=1, training=True
    )
    with pytest.raises(ValueError, match="`loss_type` must be one of"):
        aggregate_like_trl(torch.ones(2, 3), torch.ones(2, 3), loss_type="ppo", scale=scale, num_items_in_batch=None)
    with pytest.raises(ValueError, match="`loss_type` must be one of"):
        role_weights(["a", "b"], torch.ones(2), role_loss_weights={}, balance="per_role", loss_type="ppo")
    with pytest.raises(ValueError, match="`loss_type` must be one of"):
        chunk_correction(
            "ppo",
            chunk_samples=1,
            chunk_tokens=1.0,
            global_samples=2,
            global_tokens=2.0,
            num_processes=1,
            steps_per_generation=1,
        )


@pytest.fixture(scope="module")
def trl_trainer(tiny_model_dir, tmp_path_factory):
    """TRL's own GRPOTrainer on the tiny model: two reward functions, the second unscorable on some rows."""
    scores = {"first": [], "second": []}

    def first(completions, **kwargs):
        return [scores["first"].pop(0) for _ in completions]

    def second(completions, **kwargs):
        return [scores["second"].pop(0) for _ in completions]

    args = trl.GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl-grpo")),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=6,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        reward_weights=[1.0, 0.5],
        report_to="none",
    )
    trainer = trl.GRPOTrainer(
        model=tiny_model_dir, reward_funcs=[first, second], args=args, train_dataset=addition_dataset()
    )
    trainer.fixed_scores = scores
    return trainer


MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]])


def trl_loss_on(trainer, monkeypatch, *, loss_type: str, training: bool, logps, ref, old, num_items) -> torch.Tensor:
    """TRL's own loss on a fixed micro-batch of MASK's shape whose advantages are 0 (the KL term alone: ``beta`` 0.7
    times the k3 estimator, times the importance ratio under ``use_bias_correction_kl``), as the loop calls it."""
    monkeypatch.setattr(trainer, "loss_type", loss_type)
    monkeypatch.setattr(trainer, "beta", 0.7)
    monkeypatch.setattr(trainer, "current_gradient_accumulation_steps", 2, raising=False)  # set by the loop
    fixed = lambda *args, **kwargs: (logps, torch.zeros_like(logps), None)  # noqa: E731
    monkeypatch.setattr(trainer, "_get_per_token_logps_and_entropies", fixed)
    trainer.model.train(training)
    inputs = {
        "prompt_ids": torch.ones(4, 3, dtype=torch.long),
        "prompt_mask": torch.ones(4, 3, dtype=torch.long),
        "completion_ids": torch.ones(4, 5, dtype=torch.long),
        "completion_mask": MASK,
        "advantages": torch.zeros(4),
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": num_items,
    }
    return trl.GRPOTrainer.compute_loss(trainer, trainer.model, inputs)


def loss_scale(trainer, training: bool) -> LossScale:
    """The micro-batch `trl_loss_on` computes TRL's loss on: 2 accumulation steps, one process."""
    return LossScale(
        gradient_accumulation_steps=2,
        max_completion_length=trainer.max_completion_length,
        num_processes=1,
        steps_per_generation=trainer.args.steps_per_generation,
        training=training,
    )


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
def test_the_seams_reduction_is_trls_for_every_loss_type(trl_trainer, loss_type, training, monkeypatch):
    """`aggregate_like_trl` (seams/trl.py) reduces a per-token term as TRL's loss reduces its own, for every loss type
    TRL lists: TRL's loss of a micro-batch whose per-token loss is known (its KL term, advantages 0) against the seam's
    reduction of that term, value and gradient."""
    generator = torch.Generator().manual_seed(2)
    logps = (-torch.rand(MASK.shape, generator=generator) * 3).requires_grad_()
    ref = -torch.rand(MASK.shape, generator=generator) * 3
    num_items = torch.tensor(29.0)  # tokens of the whole generation batch, over every micro-batch
    monkeypatch.setattr(trl_trainer.args, "use_bias_correction_kl", False)
    theirs = trl_loss_on(
        trl_trainer,
        monkeypatch,
        loss_type=loss_type,
        training=training,
        logps=logps,
        ref=ref,
        old=None,
        num_items=num_items,
    )
    scale = loss_scale(trl_trainer, training)
    per_token = 0.7 * (torch.exp(ref - logps) - (ref - logps) - 1)
    ours = aggregate_like_trl(per_token, MASK, loss_type=loss_type, scale=scale, num_items_in_batch=num_items)
    assert theirs.item() != 0.0 and ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    their_grad, our_grad = (torch.autograd.grad(loss, logps)[0] for loss in (theirs, ours))
    assert torch.allclose(our_grad, their_grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("quantile", [1.0, 0.5], ids=["all-tokens", "top-half"])
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_the_entropy_bonus_is_trls_on_one_micro_batch(trl_trainer, loss_type, quantile, monkeypatch):
    """TRL's entropy bonus (advantages 0, so its loss is the bonus alone) against `entropy_bonus_like_trl`, value and
    gradient, for a micro-batch holding its equal share of the step's tokens (4 micro-steps of 13 tokens: 52), on
    every completion token and on TRL's high-entropy half."""
    generator = torch.Generator().manual_seed(3)
    entropies = (torch.rand(MASK.shape, generator=generator) * 3).requires_grad_()
    logps = -torch.rand(MASK.shape, generator=generator)
    num_items = MASK.sum() * trl_trainer.args.steps_per_generation
    monkeypatch.setattr(trl_trainer, "loss_type", loss_type)
    monkeypatch.setattr(trl_trainer, "beta", 0.0)
    monkeypatch.setattr(trl_trainer, "entropy_coef", 0.3)
    monkeypatch.setattr(trl_trainer, "_entropy_bonus_enabled", True, raising=False)
    monkeypatch.setattr(trl_trainer, "top_entropy_quantile", quantile)
    monkeypatch.setattr(trl_trainer, "current_gradient_accumulation_steps", 2, raising=False)
    fixed = lambda *args, **kwargs: (logps, entropies, None)  # noqa: E731
    monkeypatch.setattr(trl_trainer, "_get_per_token_logps_and_entropies", fixed)
    trl_trainer.model.train(True)
    inputs = {
        "prompt_ids": torch.ones(4, 3, dtype=torch.long),
        "prompt_mask": torch.ones(4, 3, dtype=torch.long),
        "completion_ids": torch.ones(4, 5, dtype=torch.long),
        "completion_mask": MASK,
        "advantages": torch.zeros(4),
        "num_items_in_batch": num_items,
    }
    theirs = trl.GRPOTrainer.compute_loss(trl_trainer, trl_trainer.model, inputs)
    kept = MASK if quantile == 1.0 else MASK * trl_trainer.get_high_entropy_mask(entropies, MASK, 1 - quantile)
    scale = loss_scale(trl_trainer, True)
    ours = -entropy_bonus_like_trl(
        entropies, MASK, kept, torch.full((4,), 0.3), scale=scale, num_items_in_batch=num_items
    )
    assert theirs.item() < 0.0 and ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    their_grad, our_grad = (torch.autograd.grad(loss, entropies)[0] for loss in (theirs, ours))
    assert torch.allclose(our_grad, their_grad, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize(
    "bias_correction, level", [(False, "token"), (True, "token"), (True, "sequence")], ids=["plain", "token", "seq"]
)
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("loss_type", TRL_LOSS_TYPES)
def test_the_kl_term_is_reduced_as_trls_loss(trl_trainer, loss_type, training, bias_correction, level, monkeypatch):
    """With every advantage 0, TRL's loss is its KL term alone (``trl_loss_on``); ``per_role_kl_loss`` (through
    ``aggregate_like_trl``) gives the same value and gradient, with the importance ratio of
    ``use_bias_correction_kl`` at either level. The old log-probs differ from the current ones, so the ratio differs
    from 1 in value as well as in gradient."""
    generator = torch.Generator().manual_seed(0)
    logps = (-torch.rand(MASK.shape, generator=generator) * 3).requires_grad_()
    ref = -torch.rand(MASK.shape, generator=generator) * 3
    old = logps.detach() + (torch.rand(MASK.shape, generator=generator) - 0.5) * 0.4
    num_items = torch.tensor(37.0)  # tokens of the whole generation batch, over every micro-batch
    monkeypatch.setattr(trl_trainer, "importance_sampling_level", level)
    monkeypatch.setattr(trl_trainer.args, "use_bias_correction_kl", bias_correction)
    theirs = trl_loss_on(
        trl_trainer,
        monkeypatch,
        loss_type=loss_type,
        training=training,
        logps=logps,
        ref=ref,
        old=old,
        num_items=num_items,
    )
    (their_grad,) = torch.autograd.grad(theirs, logps)
    batch = SimpleNamespace(
        ref_per_token_logps=ref,
        old_per_token_logps=old,
        sample_weights=torch.ones(4),
        completion_mask=MASK,
        num_items_in_batch=num_items,
    )
    scale = loss_scale(trl_trainer, training)
    ours, _ = per_role_kl_loss(
        logps,
        batch,
        torch.full((4,), 0.7),
        loss_type=loss_type,
        scale=scale,
        bias_correction=bias_correction,
        importance_sampling_level=level,
    )
    (our_grad,) = torch.autograd.grad(ours, logps)
    assert theirs.item() != 0.0
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert torch.allclose(our_grad, their_grad, rtol=1e-5, atol=1e-8)


def test_the_kl_bias_correction_changes_the_term():
    """On-policy the importance ratio is 1 in value: the corrected KL term equals the plain one, its gradient does
    not (TRL's default ``use_bias_correction_kl=True`` adds the KL itself to the gradient)."""
    generator = torch.Generator().manual_seed(1)
    logps = (-torch.rand(MASK.shape, generator=generator) * 3).requires_grad_()
    batch = SimpleNamespace(
        ref_per_token_logps=-torch.rand(MASK.shape, generator=generator) * 3,
        old_per_token_logps=None,
        sample_weights=torch.ones(4),
        completion_mask=MASK,
        num_items_in_batch=torch.tensor(13.0),
    )
    scale = LossScale(
        gradient_accumulation_steps=1, max_completion_length=5, num_processes=1, steps_per_generation=1, training=True
    )
    terms = {
        correction: per_role_kl_loss(
            logps,
            batch,
            torch.full((4,), 0.5),
            loss_type="grpo",
            scale=scale,
            bias_correction=correction,
            importance_sampling_level="token",
        )[0]
        for correction in (False, True)
    }
    grads = {correction: torch.autograd.grad(term, logps)[0] for correction, term in terms.items()}
    assert terms[True].item() == pytest.approx(terms[False].item(), rel=1e-6)
    assert not torch.allclose(grads[True], grads[False])


REWARDS = [
    [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0],  # the second prompt's group all equal: advantage 0 when scaled
    [0.5, None, 2.0, 0.0, 1.0, 3.0, None, 0.5],  # None: this function does not score that completion
]


@pytest.mark.parametrize(
    "scale_rewards, aggregation",
    list(itertools.product(["group", "batch", "none"], ["sum_then_normalize", "normalize_then_sum"])),
)
def test_outcome_advantages_are_trls(trl_trainer, scale_rewards, aggregation, monkeypatch):
    """TRL's advantages from its own generation step (two prompts x 4 completions, fixed rewards) against
    ``outcome_advantages`` on the rewards TRL computed."""
    monkeypatch.setattr(trl_trainer, "scale_rewards", scale_rewards)
    monkeypatch.setattr(trl_trainer, "multi_objective_aggregation", aggregation)
    trl_trainer.fixed_scores["first"] = list(REWARDS[0])
    trl_trainer.fixed_scores["second"] = list(REWARDS[1])
    trl_trainer.model.train()
    rows = [row for row in addition_dataset(2) for _ in range(4)]  # TRL's sampler repeats each prompt G times
    output = trl_trainer._generate_and_score_completions(rows)
    rewards_per_func = torch.tensor([[math.nan if v is None else v for v in column] for column in REWARDS]).T
    _, ours = outcome_advantages(
        rewards_per_func,
        trl_trainer.reward_weights,
        num_generations=4,
        scale_rewards=scale_rewards,
        aggregation=aggregation,
    )
    assert torch.allclose(ours, output["advantages"], atol=1e-6)
    assert ours.abs().sum() > 0


def trl_importance_sampling_modes() -> list[str]:
    """The modes TRL supports, as its GRPOConfig's ``vllm_importance_sampling_mode`` help lists them."""
    help_text = trl.GRPOConfig.__dataclass_fields__["vllm_importance_sampling_mode"].metadata["help"]
    supported = re.search(r"Supported options are: (.*?)\.", help_text)
    assert supported, f"GRPOConfig.vllm_importance_sampling_mode's help lists no options: {help_text[:200]!r}"
    return re.findall(r"'(\w+)'", supported.group(1))


# Four completions of one prompt: the trained policy's log-probs before the update, and the sampler's (NaN: a token
# whose log-prob the sampler did not return). Gaps of -1 to +1.5 nats, so that the clips below bind.
OLD_LOGPS = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -2.0, -1.0], [-0.5, -3.0, -1.0], [-2.0, -1.0, -1.0]])
SAMPLING_LOGPS = [[-2.0, -0.5, -1.0], [-1.0, -1.0], [-2.0, math.nan, -1.5], [-1.0]]


@pytest.mark.parametrize("clip_min, clip_max", [(None, 2.0), (0.5, 2.0), (0.3, 5.0)])
@pytest.mark.parametrize("mode", trl_importance_sampling_modes())
def test_the_importance_sampling_ratio_is_trls_for_every_mode(trl_trainer, mode, clip_min, clip_max, monkeypatch):
    """TRL's ratio from its own generation step, run on vLLM-style rollouts whose sampling log-probs are fixed (the
    old log-probs fixed too), against ``batch_importance_sampling_ratio`` on the same tensors."""
    settings = {
        "use_vllm": True,
        "vllm_importance_sampling_correction": True,
        "vllm_importance_sampling_mode": mode,
        "vllm_importance_sampling_clip_min": clip_min,
        "vllm_importance_sampling_clip_max": clip_max,
    }
    for name, value in settings.items():
        monkeypatch.setattr(trl_trainer, name, value)
    eos = trl_trainer.eos_token_ids[0]
    completion_ids = [[5, 6, eos], [5, eos], [7, 8, eos], [eos]]
    generated = ([[3, 4]] * 4, completion_ids, None, ["a"] * 4, SAMPLING_LOGPS, {}, None, None)
    monkeypatch.setattr(trl_trainer, "_generate", lambda prompts: generated)
    old = lambda *args, **kwargs: (OLD_LOGPS, None, None)  # noqa: E731
    monkeypatch.setattr(trl_trainer, "_get_per_token_logps_and_entropies", old)
    trl_trainer.fixed_scores["first"] = [1.0, 0.0, 1.0, 0.0]
    trl_trainer.fixed_scores["second"] = [0.0, 0.5, 0.5, 1.0]
    trl_trainer.model.train()
    output = trl_trainer._generate_and_score_completions([row for row in addition_dataset(1) for _ in range(4)])

    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]])
    padded = torch.tensor([row + [0.0] * (3 - len(row)) for row in SAMPLING_LOGPS])
    batch = SimpleNamespace(old_per_token_logps=OLD_LOGPS, sampling_per_token_logps=padded, completion_mask=mask)
    args = SimpleNamespace(**{k: v for k, v in settings.items() if k.startswith("vllm_importance_sampling_")})
    ours = batch_importance_sampling_ratio(batch, args)
    theirs = output["importance_sampling_ratio"]
    assert ours.shape == theirs.shape == ((4, 1) if mode.startswith("sequence") else (4, 3))
    assert torch.allclose(ours, theirs)
    assert (theirs != 1).any()  # the gaps moved the ratio: a ratio of ones everywhere would compare nothing


def test_the_seed_decides_the_initial_adapters_on_every_trl_release(tiny_model_dir, tmp_path):
    """PEFT draws the LoRA weights when TRL builds the model: TRL 1.15 seeds with ``args.seed`` first, TRL 1.14 does
    not (the seam does). Whatever the random state before, one seed gives one start, another seed another."""
    from tiny import tiny_trainer

    from trl_multiagent import SingleAgent

    def initial_lora(seed: int, state_before: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(state_before)
        trainer = tiny_trainer(tiny_model_dir, tmp_path / f"{seed}-{state_before}", SingleAgent(), seed=seed)
        return {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora_A" in n}

    first = initial_lora(seed=3, state_before=1)
    assert first and all(torch.equal(p, first[n]) for n, p in initial_lora(seed=3, state_before=2).items())
    assert not all(torch.equal(p, first[n]) for n, p in initial_lora(seed=4, state_before=1).items())
