"""TRL's ``environment_factory`` for a workflow with one role: one environment per episode, its methods the tools.

What ``GRPOTrainer(environment_factory=...)`` documents, for each generation batch:

    1. each row picks its environment: the one factory's, or with a dict of factories the one its ``environment``
       column names; one instance per episode, drawn from a pool that grows only when a batch needs more instances of
       an environment than were made so far (instances are reused across batches, reset each time);
    2. ``reset(**row)`` (the row without ``environment`` when routed) starts the episode; a text it returns is appended
       to the prompt's last message; a row without a ``prompt`` (the environment owns the data) starts from an empty
       user message;
    3. the role's tools are the trainer's ``tools`` plus the public methods of the episode's own instance (not
       ``reset``, ``get_reward`` or names starting with ``_``): an episode's tool calls act on its environment only;
    4. reward functions get ``environments`` (one instance per completion); an environment class with ``get_reward``
       is one more reward function (weight 1, named after the class), which TRL's constructor adds.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .tool_loop import RoleTools

EMPTY_PROMPT = [{"role": "user", "content": ""}]  # the prompt of a row without one (the environment supplies it)
NOT_TOOLS = ("reset", "get_reward")


def check_environment_run(roles: Sequence[str], *, rollout_ahead: int) -> None:
    """``environment_factory`` fits a workflow with one role (the environment's tools go to it), run batch by batch."""
    if len(roles) != 1:
        raise ValueError(
            "`environment_factory` gives an environment's methods as tools to the one completion of each rollout; "
            f"this workflow has roles {list(roles)}, and which of them uses the environment is the workflow's to say. "
            "Keep the environment in the workflow's `run` (one per episode) and give roles its functions with "
            "`role_tools`, or use a workflow with one role (SingleAgent)."
        )
    if rollout_ahead:
        raise ValueError(
            "rollout_ahead=1 would reset the next batch's environments (instances are reused across batches, as in "
            "TRL) before this batch's rewards read them; set rollout_ahead=0 with `environment_factory`."
        )


def environment_methods(environment: Any) -> list[Callable[..., Any]]:
    """The methods of ``environment`` offered as tools (bound to it), in name order."""
    return [
        getattr(environment, name)
        for name, _ in inspect.getmembers(type(environment), predicate=inspect.isfunction)  # the class: no properties
        if name not in NOT_TOOLS and not name.startswith("_")
    ]


def with_observation(prompt: list[dict[str, Any]], observation: str | list) -> list[dict[str, Any]]:
    """``prompt`` with ``observation`` appended to its last message's content (a new list; the row is untouched)."""
    content = prompt[-1]["content"]
    if isinstance(content, str) and isinstance(observation, str):
        joined = content + observation
    else:  # content blocks on either side: both as blocks
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
        joined = blocks + ([{"type": "text", "text": observation}] if isinstance(observation, str) else observation)
    return [*prompt[:-1], {**prompt[-1], "content": joined}]


@dataclasses.dataclass
class EnvironmentBatch:
    rows: list[dict]  # the batch's rows, each `prompt` as its episode starts (the observation appended)
    environments: list[Any]  # one instance per row, reset for it
    episode_tools: list[dict[str, RoleTools]]  # per row: the role -> its tools, bound to the row's instance


class Environments:
    """The environments of a run. ``factories``: environment name -> factory (the name None when one factory serves
    every row); ``pool``: name -> the instances made so far (the constructor's probe instance first; grown here);
    ``role``: the role that gets the tools; ``build_tools(methods)``: that role's ``RoleTools`` with the trainer's
    tools and ``methods``."""

    def __init__(
        self,
        factories: Mapping[str | None, Callable[[], Any]],
        pool: Mapping[str | None, list],
        *,
        role: str,
        build_tools: Callable[[list[Callable[..., Any]]], RoleTools],
    ):
        self.factories, self.pool, self.role = factories, pool, role
        self.routed = list(factories) != [None]
        self.tools = {name: build_tools(environment_methods(pool[name][0])) for name in factories}

    def start(self, rows: Sequence[dict]) -> EnvironmentBatch:
        names = [row.get("environment") if self.routed else None for row in rows]
        unknown = sorted({str(name) for name in names if name not in self.factories})
        if unknown:
            raise ValueError(
                f"Row(s) have `environment` {unknown}, which `environment_factory` does not name; it names "
                f"{list(self.factories)}. Set each row's `environment` column to one of them."
            )
        drawn: dict[str | None, int] = {}
        environments = []
        for name in names:  # 1.
            index = drawn.get(name, 0)
            if index == len(self.pool[name]):
                self.pool[name].append(self.factories[name]())
            drawn[name] = index + 1
            environments.append(self.pool[name][index])
        started, episode_tools = [], []
        for row, name, environment in zip(rows, names, environments):
            arguments = {k: v for k, v in row.items() if k != "environment"} if self.routed else row
            observation = environment.reset(**arguments)  # 2.
            prompt = row.get("prompt", EMPTY_PROMPT)
            started.append({**row, "prompt": prompt if observation is None else with_observation(prompt, observation)})
            tools = self.tools[name]  # 3.
            bound = {method.__name__: method for method in environment_methods(environment)}
            episode_tools.append({self.role: dataclasses.replace(tools, functions={**tools.functions, **bound})})
        return EnvironmentBatch(rows=started, environments=environments, episode_tools=episode_tools)
