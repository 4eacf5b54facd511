"""Run a loaded workflow (``trl_multiagent.checkpoints``) through the trainer's rollout engine and backends.

``run_episodes`` uses the same engine, transformers backend and adapter routing as training, so a greedy rerun of a
checkpoint reproduces the trainer's greedy outputs; ``vllm_backend`` serves a checkpoint's adapters from one vLLM
engine instead. ``make_generation_config`` gives greedy or sampled decoding as the trainer samples. Roles with tools
(the workflow's declared ``tools``, plus ``role_tools``) run their tool loops as in training (``eval_role_tools``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from transformers import GenerationConfig

from ..checkpoints import TrainedWorkflow
from ..config.multiagent_grpo_config import config_field
from ..rollout.backends.from_config import base_eos_token_ids
from ..rollout.backends.per_base import PerBaseBackend
from ..rollout.backends.transformers_backend import TransformersBackend
from ..rollout.engine import RolloutEngine
from ..rollout.records import Episode
from ..rollout.tool_loop import RoleTools, ToolSettings, build_role_tools
from ..workflows import Messages


def eos_token_ids(trained: TrainedWorkflow) -> list[int]:
    """Every id that ends a completion: the model's declared EOS ids and the tokenizer's, as TRL collects them."""
    ids = trained.model.generation_config.eos_token_id
    ids = [] if ids is None else [ids] if isinstance(ids, int) else list(ids)
    return ids if trained.tokenizer.eos_token_id in ids else [trained.tokenizer.eos_token_id, *ids]


def make_generation_config(
    trained: TrainedWorkflow, max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0
) -> GenerationConfig:
    """Greedy decoding when ``temperature == 0``, else sampling at ``temperature`` / ``top_p``.

    ``top_k=0`` as in TRL's sampler: otherwise a model's own ``generation_config.json`` (Qwen3: top_k=20) would
    silently narrow evaluation sampling relative to training.
    """
    sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature > 0 else {}
    return GenerationConfig(
        max_new_tokens=max_new_tokens,
        **(sampling or {"do_sample": False}),
        pad_token_id=trained.tokenizer.pad_token_id,
        eos_token_id=eos_token_ids(trained),
        disable_compile=True,
    )


@dataclass(frozen=True)
class EpisodeToolSettings:
    """The tool settings of ``run_episodes`` given none: its lengths and rendering, the training config's bounds."""

    max_completion_length: int | None
    role_generation_kwargs: dict[str, dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_tool_calling_iterations: int | None = config_field("max_tool_calling_iterations")
    tool_timeout: float = config_field("tool_timeout")


def eval_role_tools(
    trained: TrainedWorkflow,
    settings: ToolSettings,
    role_tools: Mapping[str, Sequence[Callable[..., Any]]] | None = None,
) -> dict[str, RoleTools]:
    """The tools of ``trained``'s roles, as training gives them under ``settings`` (``EvalSettings``, whose tool
    fields are the training config's): the workflow's declared ``tools`` plus ``role_tools`` (``{role: [function,
    ...]}``), each role's tool calls read with its base model's tokenizer."""

    def tokenizer_for_role(role: str):
        base = trained.role_bases.get(role)
        return trained.bases[base].tokenizer if base in trained.bases else trained.tokenizer

    return build_role_tools(trained.workflow, settings, tokenizer_for_role, role_tools=role_tools)


def run_episodes(
    trained: TrainedWorkflow,
    prompts: list[Messages],
    generation_config: GenerationConfig,
    *,
    rollout_batch_size: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    role_generation_kwargs: dict[str, dict[str, Any]] | None = None,
    chat_rendering: str = "tokenizer",
    role_tools: Mapping[str, RoleTools] | None = None,
) -> list[Episode]:
    """One episode per prompt through the trainer's rollout engine, transformers backend and adapter routing
    (``role_generation_kwargs``: a role's own sampling settings, ``chat_rendering``: how prompts are rendered, as in
    training; ``role_tools``: ``eval_role_tools(...)``, by default the tools the workflow declares)."""
    if role_tools is None:
        settings = EpisodeToolSettings(generation_config.max_new_tokens, role_generation_kwargs, chat_template_kwargs)
        role_tools = eval_role_tools(trained, settings)

    def backend(model, tokenizer, router, eos, config=generation_config) -> TransformersBackend:
        return TransformersBackend(
            unwrapped_model=lambda: _as_context(model),
            tokenizer=tokenizer,
            router=router,
            generation_config=config,
            eos_token_ids=eos,
            chat_template_kwargs=chat_template_kwargs,
            max_batch_size=rollout_batch_size,
            chat_rendering=chat_rendering,
        )

    main = backend(trained.model, trained.tokenizer, trained.router, eos_token_ids(trained))
    role_bases = None
    if trained.bases:  # one backend per base, each with its own tokenizer and end tokens
        backends = {None: main}
        for name, base in trained.bases.items():
            eos, config = base_eos_token_ids(base.model, base.tokenizer), copy.deepcopy(generation_config)
            config.update(pad_token_id=base.tokenizer.pad_token_id, eos_token_id=eos)
            backends[name] = backend(base.model, base.tokenizer, base.router, eos, config)
        main, role_bases = PerBaseBackend(backends), {r: trained.role_bases.get(r) for r in trained.workflow.roles}
    engine = RolloutEngine(
        trained.workflow,
        main,
        trained.role_to_adapter,
        role_generation_kwargs,
        base_for_role=role_bases,
        role_tools=role_tools,
    )
    return engine.run(prompts)


@contextmanager
def _as_context(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    yield model
