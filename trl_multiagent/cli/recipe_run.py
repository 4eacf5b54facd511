"""``RecipeRun``: what every training recipe does the same way, written once.

A recipe (``recipes/<workflow>_<task>.py``, ``recipes/train.py``) keeps what is its own: its launch command, its
workflow's arguments, the task, the workflow it builds and, where it differs, the reward. Around that it calls two
steps of ``RecipeRun``, in order:

    run = RecipeRun.parse(WorkflowArguments, paper_preset=..., cpu_preset=...)   # the command line, presets
    ...                                                                             # the recipe builds its workflow
    run.train(workflow, task)  # --validate: check and exit; else model, dataset, trainer, train, save, push

``parse`` reads TRL's ``ScriptArguments`` and ``ModelConfig``, ``MultiAgentGRPOConfig``, the built-in workflows'
options and the recipe's own dataclasses, as ``trl grpo`` reads its own (``RecipeParser``: presets that build on one
another, ``--print_config``, ``--validate``), and passes ``ModelConfig``'s model flags on to the model as TRL's script
does (model_flags.py). ``train`` builds the trainer with them, trains, saves and pushes as TRL's script does.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from trl import ModelConfig, ScriptArguments, get_peft_config, get_quantization_config

from ..common.model_names import resolve_model_name
from ..config import MultiAgentGRPOConfig
from ..config.model_flags import model_init_kwargs
from ..trainer import MultiAgentGRPOTrainer
from ..workflows.options import WorkflowOptions
from .recipe_parser import RecipeParser
from .shipped import recipe_argv

__all__ = ["CodeRewardArguments", "RecipeRun"]


@dataclass
class CodeRewardArguments:
    """The code recipes' reward (``CodeReward``)."""

    code_reward_mode: Literal["all_pass", "fraction"] = field(
        default="all_pass",
        metadata={"help": "all_pass (the paper's): 1 only if every test passes; fraction: share of tests passed."},
    )


@dataclass
class RecipeRun:
    """A training recipe's command line, parsed, and the steps every recipe shares.

    ``own``: the recipe's own dataclasses (its workflow's arguments, its reward's), parsed, in the order
    ``parse`` was given them.
    """

    parser: RecipeParser
    script_args: ScriptArguments
    args: MultiAgentGRPOConfig
    model_args: ModelConfig
    options: WorkflowOptions
    own: tuple[Any, ...]

    @classmethod
    def parse(
        cls, *own_types: type, paper_preset: Path, cpu_preset: Path, argv: Sequence[str] | None = None
    ) -> RecipeRun:
        """Parse ``argv`` (default ``sys.argv``; without ``--config``, ``paper_preset``'s settings, or a stop naming
        ``cpu_preset`` on a machine that cannot train them: ``shipped.recipe_argv``). ``--print_config`` prints the
        settings and exits here."""
        parser = RecipeParser(
            (ScriptArguments, MultiAgentGRPOConfig, ModelConfig, WorkflowOptions, *own_types), validates=True
        )
        argv = recipe_argv(list(sys.argv if argv is None else argv), paper_preset=paper_preset, cpu_preset=cpu_preset)
        script_args, args, model_args, options, *own = parser.parse_args_and_config(argv)
        args.model_init_kwargs = model_init_kwargs(model_args, args)  # as TRL's `trl grpo` passes the model flags on
        return cls(parser, script_args, args, model_args, options, tuple(own))

    def validate_if_asked(self, workflow, task) -> None:
        """With ``--validate``: the trainer's checks of these settings with ``workflow`` on ``task``'s dataset, then
        exit, nothing loaded (``RecipeParser.validate_if_asked``); without it, nothing. ``trainer`` calls it first: a
        recipe calls it itself only to validate before it loads a dataset of its own."""
        self.parser.validate_if_asked(workflow, task)

    def trainer(self, workflow, task, *, reward_funcs=None, train_dataset=None) -> MultiAgentGRPOTrainer:
        """With ``--validate``: the trainer's checks of these settings with ``workflow`` on ``task``'s dataset, then
        exit, nothing loaded. Else the trainer: the model (every ``ModelConfig`` flag, quantization included) with
        the LoRA of ``ModelConfig``, ``train_dataset`` (default: ``task``'s, as ``--dataset_name`` names it),
        ``reward_funcs`` (default: ``task``'s reward), and ``task``'s answer checker regrading each role's outputs
        when the dataset has the task's ground-truth column."""
        self.validate_if_asked(workflow, task)
        if train_dataset is None:
            script = self.script_args
            train_dataset = task.train_dataset(
                script.dataset_name, script.dataset_train_split, self.args.seed, self.args.bad_rows
            )
        regrade = task.answer_checker is not None and task.ground_truth in train_dataset.column_names
        return MultiAgentGRPOTrainer(
            model=resolve_model_name(self.model_args.model_name_or_path),
            workflow=workflow,
            reward_funcs=task.make_reward() if reward_funcs is None else reward_funcs,
            args=self.args,
            train_dataset=train_dataset,
            peft_config=get_peft_config(self.model_args),
            quantization_config=get_quantization_config(self.model_args),
            answer_checker=task.answer_checker if regrade else None,
        )

    def train(self, workflow, task, *, reward_funcs=None, train_dataset=None) -> MultiAgentGRPOTrainer:
        """``trainer`` (which exits under ``--validate``), then train (resuming from ``--resume_from_checkpoint``),
        save to ``--output_dir`` and, with ``--push_to_hub``, push."""
        trainer = self.trainer(workflow, task, reward_funcs=reward_funcs, train_dataset=train_dataset)
        trainer.train(resume_from_checkpoint=self.args.resume_from_checkpoint)
        trainer.save_model(self.args.output_dir)
        if self.args.push_to_hub:
            trainer.push_to_hub(dataset_name=self.script_args.dataset_name)
        return trainer
