"""The public surface, held against a checked-in snapshot (``public_surface.txt`` beside this file).

What counts as public: the ``__all__`` of the package, of its subpackages, of its top-level modules and of the modules
every folder shares (``common``: ``model_names``, ``parse_rules``; the seams, internal, aside); the members
``MultiAgentGRPOTrainer`` has beyond ``trl.GRPOTrainer``'s (its class members, and the attributes its methods set on
``self``) and the fields and methods ``MultiAgentGRPOConfig`` has beyond ``trl.GRPOConfig``'s; the ``trl-multiagent``
commands, their own flags and the flags of our own argument dataclasses in the recipes they run; and every deprecated
name, with what replaces it.

A name that appears or disappears fails the test until the snapshot changes with it: run

    python tests/package/test_public_surface.py --update

which rewrites the snapshot. A name that disappears stays in the snapshot as a ``removed`` line, and a removed line
fails the test until CHANGELOG.md names it (so a removal without a deprecation is said where users read).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.util
import pkgutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = Path(__file__).with_name("public_surface.txt")
CHANGELOG = ROOT / "CHANGELOG.md"
UPDATE = "python tests/package/test_public_surface.py --update"
INTERNAL_PACKAGES = ("trl_multiagent.seams",)  # helpers over the upstreams' internals, not an API of ours


def module_surface() -> list[str]:
    import trl_multiagent

    names = []
    # The package, its subpackages, its top-level modules and those every folder shares (common/: model_names,
    # parse_rules); any other module inside a subpackage is that folder's own.
    modules = ["trl_multiagent"] + [
        info.name
        for info in pkgutil.walk_packages(trl_multiagent.__path__, "trl_multiagent.")
        if info.ispkg or info.name.count(".") == 1 or info.name.startswith("trl_multiagent.common.")
    ]
    for name in sorted(modules):
        if name.startswith(INTERNAL_PACKAGES) or ".recipes" in name:
            continue
        path = importlib.util.find_spec(name).origin
        tree = ast.parse(Path(path).read_text())  # read, not imported: most modules need torch, some vllm
        for node in tree.body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                names += [f"module {name}: {exported}" for exported in ast.literal_eval(node.value)]
    return names


def self_attributes(path: Path) -> set[str]:
    """The public attributes the methods of ``path``'s classes set on ``self``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            for leaf in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                    if not leaf.attr.startswith("_"):
                        found.add(leaf.attr)
    return found


def trainer_surface() -> tuple[list[str], list[str]]:
    """(live lines, deprecated lines) of the trainer."""
    import inspect

    import trl

    from trl_multiagent.trainer import MultiAgentGRPOTrainer
    from trl_multiagent.trainer.renamed_hooks import REPLACED_BY, RenamedTrainerNames

    theirs = set(dir(trl.GRPOTrainer))
    for cls in trl.GRPOTrainer.__mro__:  # what TRL's and the Trainer's own methods set on self
        if cls.__module__.startswith(("trl.", "transformers.")):
            theirs |= self_attributes(Path(inspect.getsourcefile(cls)))
    ours = {n for n in dir(MultiAgentGRPOTrainer) if not n.startswith("_")}
    package = ROOT / "trl_multiagent"
    ours |= self_attributes(package / "trainer" / "multiagent_grpo_trainer.py")
    ours |= self_attributes(package / "trainer" / "grpo_seam.py")
    deprecated = {n for n in vars(RenamedTrainerNames) if not n.startswith("_")}
    assert deprecated == REPLACED_BY.keys(), "renamed_hooks.REPLACED_BY says what replaces each old name"
    live = [f"trainer: {name}" for name in sorted(ours - theirs - deprecated)]
    return live, sorted(f"deprecated MultiAgentGRPOTrainer.{name} -> {REPLACED_BY[name]}" for name in deprecated)


def config_surface() -> list[str]:
    import trl

    from trl_multiagent.config import MultiAgentGRPOConfig

    theirs = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    fields = {f.name for f in dataclasses.fields(MultiAgentGRPOConfig)} - theirs
    members = {n for n in vars(MultiAgentGRPOConfig) if not n.startswith("_")} - fields - set(dir(trl.GRPOConfig))
    return [f"config field: {name}" for name in sorted(fields)] + [f"config member: {n}" for n in sorted(members)]


class _Captured(Exception):
    def __init__(self, parser: argparse.ArgumentParser):
        self.parser = parser


def _flags_of(run, monkeypatch) -> list[str]:
    """The option strings of the argparse parser ``run()`` parses with (captured as it starts parsing)."""

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    with monkeypatch.context() as patch:
        patch.setattr(argparse.ArgumentParser, "parse_known_args", capture)
        with pytest.raises(_Captured) as captured:
            run()
    return options(captured.value.parser)


def options(parser: argparse.ArgumentParser) -> list[str]:
    """A parser's long options, ``--help`` aside."""
    flags = {s for action in parser._actions for s in action.option_strings if s.startswith("--")}
    return sorted(flags - {"--help"})


def _our_dataclass_flags(recipe: Path) -> list[str]:
    """The flags of the recipe's own argument dataclasses (TRL's, and MultiAgentGRPOConfig's fields, listed apart)."""
    from trl_multiagent.config import MultiAgentGRPOConfig
    from trl_multiagent.workflows.options import WorkflowOptions

    spec = importlib.util.spec_from_file_location(f"_surface_{recipe.stem}", recipe)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the recipe's dataclasses; its `__main__` block does not run
    classes = []
    for node in ast.walk(ast.parse(recipe.read_text())):
        if not isinstance(node, ast.Call):
            continue
        if getattr(node.func, "id", None) in ("RecipeParser", "TrlParser"):
            classes += [getattr(module, name.id) for name in node.args[0].elts]
        elif isinstance(node.func, ast.Attribute) and ast.unparse(node.func) == "RecipeRun.parse":
            # RecipeRun's parser: TRL's dataclasses, the config, the built-in workflows' options and the recipe's own
            classes += [WorkflowOptions, *(getattr(module, name.id) for name in node.args)]
    flags = set()
    for cls in classes:
        if cls is MultiAgentGRPOConfig or cls.__module__.startswith(("trl.", "transformers.")):
            continue
        flags |= {f"--{f.name}" for f in dataclasses.fields(cls)}
    return sorted(flags)


def cli_surface(monkeypatch) -> list[str]:
    from trl_multiagent.cli import commands as cli
    from trl_multiagent.cli import report, vllm_serve
    from trl_multiagent.cli.validation import SETTINGS_ONLY

    lines = [f"cli command: {command}" for command in cli.COMMANDS]
    lines += [f"cli train: {flag}" for flag in _flags_of(lambda: cli.train_command(["eval_opt"]), monkeypatch)]
    lines += [f"cli train: {flag}" for flag in ("--config", *SETTINGS_ONLY)]  # read by the recipes' RecipeParser
    serve = vllm_serve.parser(list(cli.BUILT_IN))
    lines += [f"cli vllm-serve: {flag}" for flag in options(serve)]
    lines += [f"cli report: {flag}" for flag in _flags_of(lambda: report.main([]), monkeypatch)]
    for recipe in sorted((ROOT / "recipes").glob("*.py")):
        lines += [f"recipe {recipe.name}: {flag}" for flag in _our_dataclass_flags(recipe)]
    return sorted(set(lines))


def deprecated_module_names() -> list[str]:
    from trl_multiagent.common.deprecation import MOVED
    from trl_multiagent.common.moved_modules import MOVED_MODULES

    lines = [f"deprecated module {old} -> {new}" for old, new in MOVED_MODULES.items()]
    lines += [
        f"deprecated {module}.{old} -> {new[0] if isinstance(new, tuple) else new}"
        for module, moved in MOVED.items()
        for old, new in moved.items()
    ]
    return sorted(lines)


def surface(monkeypatch) -> list[str]:
    trainer, deprecated = trainer_surface()
    lines = module_surface() + trainer + config_surface() + cli_surface(monkeypatch)
    return sorted(lines) + deprecated_module_names() + deprecated


def read_snapshot() -> tuple[list[str], list[str]]:
    """(live lines, removed lines) of the snapshot."""
    lines = [line for line in SNAPSHOT.read_text().splitlines() if line and not line.startswith("#")]
    removed = [line.removeprefix("removed ") for line in lines if line.startswith("removed ")]
    return [line for line in lines if not line.startswith("removed ")], removed


def still_served(line: str, current: list[str]) -> bool:
    """Whether a name gone from the live surface still works under a deprecated alias (it moved, or became private):
    a deprecated line names it, or the module it lived in."""
    deprecated = [removed_name(c) for c in current if c.startswith("deprecated ")]
    name = removed_name(line)
    modules = [d.removeprefix("module ") for d in deprecated if d.startswith("module ")]
    return name in deprecated or any(name.startswith(f"{module}.") for module in modules)


def write_snapshot(current: list[str]) -> None:
    live, removed = read_snapshot() if SNAPSHOT.exists() else ([], [])
    gone = {line for line in set(live) - set(current) if not still_served(line, current)}
    removed = sorted(set(removed) | gone - set(current))
    header = [
        "# The public surface of trl-multiagent (tests/package/test_public_surface.py). Update with",
        f"#     {UPDATE}",
        "# A `removed` line is a name that is gone: CHANGELOG.md must name it.",
    ]
    SNAPSHOT.write_text("\n".join([*header, *current, *(f"removed {line}" for line in removed)]) + "\n")


def removed_name(line: str) -> str:
    """The name a CHANGELOG entry is expected to spell, from a snapshot line."""
    what = line.split(" -> ")[0].split(": ", 1)[-1].removeprefix("deprecated ")
    if line.startswith("trainer: "):
        return f"MultiAgentGRPOTrainer.{what}"
    if line.startswith(("config field: ", "config member: ")):
        return f"MultiAgentGRPOConfig.{what}"
    if line.startswith("module "):
        return f"{line.split(':')[0].removeprefix('module ')}.{what}"
    return what


@pytest.fixture(scope="module")
def current_surface() -> list[str]:
    with pytest.MonkeyPatch.context() as patch:
        return surface(patch)


def test_the_public_surface_is_the_snapshot(current_surface):
    current = current_surface
    live, _ = read_snapshot()
    appeared = sorted(set(current) - set(live))
    gone = sorted(set(live) - set(current))
    assert not appeared and not gone, (
        "The public surface changed without tests/package/public_surface.txt:\n"
        + "".join(f"  new:  {line}\n" for line in appeared)
        + "".join(f"  gone: {line}\n" for line in gone)
        + f"If that is meant, update the snapshot with `{UPDATE}`"
        + (" and say what is gone in CHANGELOG.md (Removed, or Deprecated with an alias)." if gone else ".")
    )


def test_every_removed_name_is_in_the_changelog():
    _, removed = read_snapshot()
    text = CHANGELOG.read_text()
    missing = [line for line in removed if removed_name(line) not in text]
    assert not missing, "Gone from the public surface and not named in CHANGELOG.md:\n" + "\n".join(missing)


def test_the_snapshot_check_sees_a_name_appear_and_one_go(current_surface, monkeypatch, tmp_path):
    """The comparison above against a planted snapshot: one live name missing from it, one extra in it."""
    current = current_surface
    planted = tmp_path / "public_surface.txt"
    planted.write_text("\n".join([*current[1:], "module trl_multiagent: Gone"]) + "\n")
    monkeypatch.setattr(sys.modules[__name__], "SNAPSHOT", planted)
    with pytest.raises(AssertionError) as failed:
        test_the_public_surface_is_the_snapshot(current)
    assert f"new:  {current[0]}" in str(failed.value) and "gone: module trl_multiagent: Gone" in str(failed.value)
    assert UPDATE in str(failed.value) and "CHANGELOG.md" in str(failed.value)
    write_snapshot(current)  # an update keeps what went as a removed line, which the CHANGELOG must name
    assert read_snapshot() == (current, ["module trl_multiagent: Gone"])
    assert removed_name("module trl_multiagent: Gone") == "trl_multiagent.Gone"


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(f"usage: {UPDATE}")
    with pytest.MonkeyPatch.context() as patch:
        write_snapshot(surface(patch))
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}")


def test_a_name_still_served_under_a_deprecated_alias_is_not_recorded_as_removed(monkeypatch, tmp_path):
    """A module that moved and an attribute that became private keep working with a warning: an update records
    neither as removed; a name with no alias is."""
    planted = tmp_path / "public_surface.txt"
    planted.write_text("module trl_multiagent.old_place: thing\ntrainer: now_private\ntrainer: gone\n")
    monkeypatch.setattr(sys.modules[__name__], "SNAPSHOT", planted)
    current = [
        "deprecated module trl_multiagent.old_place -> trl_multiagent.new_place",
        "deprecated MultiAgentGRPOTrainer.now_private -> _now_private",
    ]
    write_snapshot(current)
    assert read_snapshot() == (current, ["trainer: gone"])
