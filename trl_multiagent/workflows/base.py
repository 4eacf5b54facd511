"""The workflow contract: what roles say to each other, never how they are computed.

A workflow is a small object with the role types it uses and an async ``run`` that awaits
``generate(role, messages)`` as often as it likes and returns the final answer text. It never sees a
model, tokenizer, optimizer or logger: the rollout engine turns every ``generate`` call into a
training sample tagged with the role, the role instance and the episode.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .formats import OutputFormat
from .reward_policy import RoleRewardPolicy

Messages = list[dict[str, Any]]  # chat messages: [{"role": "user", "content": "..."}]


class Generate(Protocol):
    """What a workflow awaits to get one model output.

    ``role`` must be one of the workflow's ``roles``. ``instance`` tells parallel copies of one role type
    apart (voter 0, 1, 2 share the ``generator`` role type); sequential calls of one agent keep instance 0.
    """

    async def __call__(self, role: str, messages: Messages, *, instance: int = 0) -> str: ...


class Workflow:
    """Base class of a multi-agent workflow.

    Subclasses set ``roles`` (the role types, each routed to an adapter by the trainer) and implement
    ``run``. ``run`` receives the dataset row's conversational ``prompt`` and returns the final answer,
    on which the outcome reward is computed with the trainer's ``reward_funcs``.

    ``formats`` (optional) declares, per role type, what its output is and the rule that reads it
    (``formats.BoxedAnswer()``, ``Verdict()``, ``Selection(n)``, ``Strategies(n)``, ...). The per-role metrics
    (``role/<role>/unparseable``, regrading, verdict and selection accuracy, pass@k) and the evaluators read role
    outputs through it; a role whose format is a verdict or a selection is a judge for the drift alarms, whatever its
    name; a role without a declared format gets the generic style metrics only.

    ``parallel`` (optional) declares, per role type run as parallel instances, the most instances one episode can
    have (Orch-Workers runs between 1 and ``n_workers`` workers), for setups that must know it before any episode
    runs (one optimizer step per instance).

    ``group_key(role, instance)`` (optional) says which calls are compared with each other under
    ``advantage_groups="calls"``, where every call is its own GRPO sample: the calls of one prompt's episodes whose
    keys are equal form one group. Default: the role type, so a role's instances and repeated calls are one group;
    return e.g. ``f"{role}{instance}"`` to give each parallel instance a group of its own.

    ``role_reward_policy`` (optional, a ``RoleRewardPolicy``) says what the built-in per-role rewards
    (``role_rewards="reference"`` or ``"balanced"``) reward each role's calls by: its own output read through its
    format (the default for every role), the episode's outcome, or nothing (see ``reward_policy.py``).

    ``tools`` (optional) gives role types Python functions to call (type hints and a Google-style docstring describe
    each to the model): every ``generate`` of such a role runs its tool loop (the model calls tools and sees their
    outputs until it answers) and returns the final text. The workflow only declares them; the rollout engine runs
    the loop, each model call of it one training sample. Declare them as a class attribute or property (values set
    in ``__init__`` would be saved in ``config_dict``).
    """

    roles: tuple[str, ...] = ()
    formats: Mapping[str, OutputFormat] = {}
    parallel: Mapping[str, int] = {}
    role_reward_policy: RoleRewardPolicy = RoleRewardPolicy()
    tools: Mapping[str, Sequence[Callable[..., object]]] = {}

    async def run(self, prompt: Messages, generate: Generate) -> str:
        raise NotImplementedError

    def group_key(self, role: str, instance: int) -> str:
        """The GRPO group of a call of ``role`` instance ``instance`` under ``advantage_groups="calls"``, within its
        prompt's episodes. Default: the role type, its instances and repeated calls together."""
        return role

    def config_dict(self) -> dict[str, Any]:
        """The parameters that rebuild this workflow: its public attributes, each a constructor parameter of the same
        name. Saved next to checkpoints (with the class's import path, which ``load_trained_workflow`` calls with
        them) and in model cards; the trainer checks when it is built that they save as JSON and rebuild it."""
        params = {k: v for k, v in vars(self).items() if not k.startswith("_")}
        return {"workflow": type(self).__name__, **params}


def request_text(prompt: Messages | str) -> str:
    """The content of a conversational prompt's last user message, whole; a plain-text prompt (TRL's standard
    format) as it is."""
    if isinstance(prompt, str):
        return prompt
    content = _last_user(prompt)["content"]
    if isinstance(content, list):  # multimodal-style content parts
        return "".join(part.get("text", "") for part in content if part.get("type") == "text")
    return content


def problem_text(prompt: Messages | str) -> str:
    """The problem statement of a conversational prompt, without the instructions meant for a lone solver.

    A task's rows may say where the problem ends: the last user message's ``"problem"`` key (the math rows set it:
    their message is the problem plus "reason step by step, box the answer", which must not reach a judge).
    Otherwise the whole last user message is the problem (the code rows keep the program's form in it: which
    function to write, or that it reads standard input, is part of the problem for every role).
    """
    if isinstance(prompt, str):
        return prompt
    problem = _last_user(prompt).get("problem")
    return problem if isinstance(problem, str) and problem else request_text(prompt)


def _last_user(prompt: Messages) -> dict[str, Any]:
    for message in reversed(prompt):
        if message.get("role") == "user":
            return message
    raise ValueError(f"The prompt has no user message: {prompt!r}. Each row's `prompt` must end with a user turn.")
