"""A workflow's saved configuration: what ``multiagent_config.json`` records of it, the check that it can be saved
and rebuilt (made when the trainer is built, before a run that would fail at its first checkpoint), and the
workflow rebuilt from it.

The record is the workflow's ``config_dict()`` (its class name and public attributes) plus ``import_path``, the
class as ``module:Class``: ``workflow_from_config`` imports that class and calls it with the saved attributes, so any
workflow defined in an importable module round-trips, not only the built-in ones. Records written before the import
path was saved rebuild the built-in workflows by name.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
from typing import Any

from ..workflows import EvalOpt, OrchWorkers, SingleAgent, Voting, Workflow

logger = logging.getLogger(__name__)

BUILT_IN_WORKFLOWS = {cls.__name__: cls for cls in (EvalOpt, Voting, OrchWorkers, SingleAgent)}
IMPORT_PATH = "import_path"


def import_path(cls: type) -> str:
    """``module:Class`` of a class (``trl_multiagent.workflows.voting:Voting``)."""
    return f"{cls.__module__}:{cls.__qualname__}"


def workflow_config(workflow: Workflow) -> dict[str, Any]:
    """What ``multiagent_config.json`` records of ``workflow``: its ``config_dict()`` with its class's import path
    after the class name."""
    params = dict(workflow.config_dict())
    name = params.pop("workflow", type(workflow).__name__)
    return {"workflow": name, IMPORT_PATH: import_path(type(workflow)), **params}


def workflow_from_config(config: dict[str, Any]) -> Workflow:
    """Rebuild a workflow from its saved record: the class at ``import_path`` called with the saved attributes, e.g.
    ``{"workflow": "Voting", "import_path": "trl_multiagent.workflows.voting:Voting", "n_voters": 3}``; a record
    without an import path (saved by an earlier version) rebuilds a built-in workflow by its name."""
    params = dict(config)
    name, path = params.pop("workflow", None), params.pop(IMPORT_PATH, None)
    if path is None:
        return _built_in(name, params)
    return _workflow_class(path, params)(**params)


def check_workflow_config(workflow: Workflow) -> None:
    """Fail now, naming the attribute and the fix, when ``workflow`` could not be saved in a checkpoint's
    ``multiagent_config.json`` or rebuilt from it by ``load_trained_workflow``; warn when its class cannot be imported
    by its path elsewhere (a class of the running script or of a function), which then needs ``workflow=`` to load.

    The check builds the workflow once more from its record, as loading does (workflows are plain objects that touch
    no model, so that is cheap).
    """
    cls, config = type(workflow), workflow_config(workflow)
    for key, value in config.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as error:
            raise ValueError(
                f"{cls.__name__}.{key} ({type(value).__name__}) cannot be saved: a checkpoint's "
                f"multiagent_config.json records a workflow's public attributes (Workflow.config_dict) to rebuild it "
                f"with {cls.__name__}(**attributes), and JSON cannot hold this one ({error}). Keep it private "
                f"(self._{key}), made in __init__ from parameters JSON can hold (a URL, a name, a number), or "
                "override config_dict() to return those parameters."
            ) from None
    saved = json.loads(json.dumps(config))
    params = {key: value for key, value in saved.items() if key not in ("workflow", IMPORT_PATH)}
    try:
        rebuilt = cls(**params)
    except Exception as error:
        accepted = inspect.signature(cls).parameters
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        unknown = [key for key in params if key not in accepted and not takes_any]
        what = f"attribute(s) {unknown} are not parameters of {cls.__name__}()" if unknown else f"raised {error!r}"
        raise ValueError(
            f"{cls.__name__} cannot be rebuilt from what a checkpoint saves of it: {cls.__name__}(**{params}) "
            f"{what}. load_trained_workflow rebuilds a workflow by calling its class with the public attributes "
            "it saved (Workflow.config_dict): store each constructor parameter under its own name, keep other "
            "attributes private (a leading underscore) or make them properties, or override config_dict() to return "
            "the constructor's parameters."
        ) from error
    again = json.loads(json.dumps(workflow_config(rebuilt)))
    changed = sorted(key for key in saved.keys() | again.keys() if saved.get(key) != again.get(key))
    if changed:
        differences = "; ".join(f"{key}: {saved.get(key)!r} -> {again.get(key)!r}" for key in changed)
        raise ValueError(
            f"{cls.__name__} rebuilt from what a checkpoint saves of it is not the same workflow ({differences}): "
            f"load_trained_workflow calls {cls.__name__}(**attributes) with the public attributes it saved, so "
            "__init__ must store each parameter as given, under its own name (keep derived values private or make "
            "them properties), or config_dict() must return the constructor's parameters."
        )
    if _importable(config[IMPORT_PATH]) is not cls:
        logger.warning(
            "%s is defined where it cannot be imported by its path %r (the running script, a function, or exec'd "
            "code): a checkpoint of this run records it, and load_trained_workflow(path) elsewhere cannot rebuild "
            "it. Define it in an importable module (my_package/flows.py) to load it by path, or pass "
            "workflow=%s(...) to load_trained_workflow.",
            cls.__name__,
            config[IMPORT_PATH],
            cls.__name__,
        )


def _importable(path: str) -> Any:
    """The object at ``module:qualname``, or None when it cannot be imported from elsewhere."""
    module, _, qualname = path.partition(":")
    if module == "__main__" or "<locals>" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found


def _workflow_class(path: str, params: dict[str, Any]) -> type[Workflow]:
    found = _importable(path)
    if found is None:
        raise ValueError(
            f"The saved workflow class {path!r} cannot be imported here: install or put its module on PYTHONPATH, or "
            f"{_pass_it_yourself(params)}"
        )
    # Only a Workflow subclass is called: a checkpoint from elsewhere must not call any importable object it names.
    if not (isinstance(found, type) and issubclass(found, Workflow)):
        raise ValueError(f"The saved workflow class {path!r} is not a Workflow subclass; refusing to call it.")
    return found


def _built_in(name: str | None, params: dict[str, Any]) -> Workflow:
    if name not in BUILT_IN_WORKFLOWS:
        raise ValueError(
            f"Workflow {name!r} is not built in ({sorted(BUILT_IN_WORKFLOWS)}) and its record has no import path; "
            f"{_pass_it_yourself(params)}"
        )
    if "prompts" not in params:  # saved before prompt sets existed: the workflows as they ran then
        params = {**_BEFORE_PROMPT_SETS[name], **params}
    if "parsing" not in params and name in _BEFORE_PARSING_RULES:  # saved when the judges were read by the last box
        params["parsing"] = "robust"
    return BUILT_IN_WORKFLOWS[name](**params)


def _pass_it_yourself(params: dict[str, Any]) -> str:
    return (
        "rebuild it yourself and pass it explicitly: load_trained_workflow(path, workflow=YourWorkflow(**params)) "
        f"with params {params}."
    )


_BEFORE_PROMPT_SETS = {
    "EvalOpt": {"history": "fresh", "prompts": "guarded"},
    "Voting": {"prompts": "guarded"},
    "OrchWorkers": {"workers": "fixed", "prompts": "guarded"},
    "SingleAgent": {"template": "raw", "prompts": "guarded"},
}
_BEFORE_PARSING_RULES = ("EvalOpt", "Voting", "OrchWorkers")  # the workflows with judges' readers
