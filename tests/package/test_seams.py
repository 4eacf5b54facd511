"""Every upstream internal behind its seam: only ``trl_multiagent/seams/<upstream>.py`` (and, for the private members
of TRL's ``GRPOTrainer`` and the Trainer, ``grpo_seam.py``) goes below an upstream's public surface.

What counts, read from the source with ``ast`` (every module of the package, imports inside functions too):

- an import below the public surface. An upstream's public surface is its top-level package (``from trl import
  nanstd`` would be public, ``from trl.trainer.utils import nanstd`` is not) plus the modules its API reference
  documents as such: ``transformers.integrations`` (the Callbacks reference: ``integrations.TensorBoardCallback``),
  ``accelerate.utils`` (accelerate's "Utilities" reference), ``deepspeed.zero`` and ``deepspeed.utils`` (DeepSpeed's
  ZeRO reference). ``from <public> import _x`` is below it too, and so is reaching a
  submodule through attributes (``transformers.trainer_utils.x`` after ``import transformers``);
- a private name of an upstream: a name starting with ``_`` that the upstream's sources we rely on define (the
  files in ``UPSTREAM_SOURCES``: PEFT's LoRA layers and tuner, accelerate's accelerator and gradient
  state, ...), read as an attribute of anything but a class's own ``self`` / ``cls`` in its methods
  (``layer._active_adapter``, ``super()._save``, ``cls._VALID_DICT_FIELDS`` in a decorator), as a string given to
  getattr / setattr / hasattr / delattr, or defined in the body of a class that subclasses an upstream class (and read
  on its ``self`` there); plus the few attributes an upstream keeps undocumented without an underscore
  (``UNDOCUMENTED``);
- a replaced method: assigning or deleting, on anything but a class's own ``self`` / ``cls``, an attribute named after
  a method of the upstream classes we touch or of torch's ``Module`` / ``Optimizer`` (``engine.module.forward = ...``,
  ``optimizer.step = ...``).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
from pathlib import Path

import pytest
import torch

PACKAGE = Path(__file__).resolve().parents[2] / "trl_multiagent"
SEAMS = PACKAGE / "seams"
GRPO_SEAM = PACKAGE / "trainer" / "grpo_seam.py"

PUBLIC_MODULES = {
    "trl": {"trl"},
    "transformers": {"transformers", "transformers.integrations"},  # its Callbacks reference: integrations.*Callback
    "peft": {"peft"},
    "accelerate": {"accelerate", "accelerate.utils"},
    "deepspeed": {"deepspeed", "deepspeed.zero", "deepspeed.utils"},
}
UPSTREAMS = tuple(PUBLIC_MODULES)
REPLACED = "replaced method"  # what replaces a method of an upstream's (or torch's) object, whatever the upstream
IMPORTS = ("import ", "from ")

# The upstream sources whose private names count, per upstream: the classes and helpers the package touches.
UPSTREAM_SOURCES = {
    "trl": [
        "trainer/grpo_trainer.py",
        "trainer/grpo_config.py",
        "trainer/utils.py",
        "models/utils.py",
        "chat_template_utils.py",
        "data_utils.py",
    ],
    "transformers": [
        "trainer.py",
        "training_args.py",
        "trainer_callback.py",
        "trainer_utils.py",
        "modeling_utils.py",
        "integrations/deepspeed.py",
        "tokenization_utils_base.py",
    ],
    "peft": [
        "peft_model.py",
        "mapping_func.py",
        "tuners/tuners_utils.py",
        "tuners/lora/layer.py",
        "tuners/lora/model.py",
    ],
    "accelerate": ["accelerator.py", "state.py", "optimizer.py", "utils/operations.py"],
    "deepspeed": [
        "runtime/engine.py",
        "runtime/zero/stage3.py",
        "runtime/zero/stage_1_and_2.py",
        "runtime/zero/partition_parameters.py",
    ],
}
# Attributes an upstream sets on its objects and does not document, without an underscore.
UNDOCUMENTED = {
    "deepspeed": {"grad_partitions_flat_buffer", "ds_id"},  # ZeRO-3's flat gradient buffer; a partitioned param's id
    "transformers": {"hf_deepspeed_config"},  # TrainingArguments' DeepSpeed config object, built in __post_init__
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def upstream_root(upstream: str) -> Path:
    spec = importlib.util.find_spec(upstream)  # a top-level spec: found without importing the package
    assert spec is not None and spec.submodule_search_locations, f"{upstream} is not installed (the test extra has it)"
    return Path(next(iter(spec.submodule_search_locations)))


def private_names(upstream: str) -> set[str]:
    """Every private name the upstream's sources in ``UPSTREAM_SOURCES`` define: functions, classes and methods,
    class and module attributes, attributes of ``self`` / ``cls``, and attributes they set on other objects (not
    what they merely read elsewhere, such as ``os._exit``)."""
    names = set(UNDOCUMENTED.get(upstream, ()))
    for relative in UPSTREAM_SOURCES[upstream]:
        path = upstream_root(upstream) / relative
        assert path.is_file(), f"{upstream}'s {relative} is gone: update UPSTREAM_SOURCES"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
                own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
                candidates = [node.attr] if own or isinstance(node.ctx, ast.Store) else []
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                candidates = [node.name]
            elif isinstance(node, ast.Assign):
                candidates = [t.id for t in node.targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                candidates = [node.target.id]
            else:
                continue
            names |= {n for n in candidates if _is_private(n)}
    return names


def method_names() -> set[str]:
    """Methods of the upstream objects the package holds (torch's Module and Optimizer, and what PEFT, DeepSpeed,
    accelerate and the Trainer build on them): replacing one on an instance is patching the upstream."""
    import accelerate
    import peft
    import transformers
    import trl

    classes = [torch.nn.Module, torch.optim.Optimizer, peft.PeftModel, accelerate.Accelerator, transformers.Trainer]
    classes += [trl.GRPOTrainer, transformers.PreTrainedModel]
    return {n for cls in classes for n, v in inspect.getmembers(cls) if callable(v) and not n.startswith("__")}


PRIVATE = {upstream: private_names(upstream) for upstream in UPSTREAMS}
METHODS = method_names()


def module_of(name: str) -> tuple[str, bool] | None:
    """(upstream, whether ``name`` is a module of it) for a dotted name under an upstream, else None."""
    upstream = name.split(".")[0]
    if upstream not in PUBLIC_MODULES:
        return None
    path = upstream_root(upstream).joinpath(*name.split(".")[1:])
    return upstream, path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def below_surface(module: str) -> bool:
    """Whether importing ``module`` (an upstream's) goes below the upstream's public surface."""
    upstream = module.split(".")[0]
    return module not in PUBLIC_MODULES[upstream] or any(_is_private(p) for p in module.split("."))


def upstream_uses(source: str) -> list[tuple[int, str, str]]:
    """``(line, upstream, what)`` for every place ``source`` goes below an upstream's public surface."""
    tree = ast.parse(source)
    found: list[tuple[int, str, str]] = []
    bound: dict[str, str] = {}  # local name -> upstream module it is bound to (`import transformers`)
    upstream_names: set[str] = set()  # names imported from an upstream (classes a class here may subclass)
    other_modules: set[str] = set()  # names bound to other modules (`import os`: `os._exit` is no upstream's)

    def private(name: str) -> list[str]:
        return [u for u in UPSTREAMS if name in PRIVATE[u]]

    own = {  # `self.x` / `cls.x` in the methods of a class here: the class's own attributes
        id(sub)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for method in cls.body
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))
        for sub in ast.walk(method)
        if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls")
    }

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top not in PUBLIC_MODULES:
                    other_modules.add(alias.asname or top)
                else:
                    # `import a.b` binds `a`; `import a.b as c` binds `c` to `a.b`
                    bound[alias.asname or top] = alias.name if alias.asname else top
                    if below_surface(alias.name):
                        found.append((node.lineno, alias.name.split(".")[0], f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            upstream = node.module.split(".")[0]
            if upstream not in PUBLIC_MODULES:
                continue
            upstream_names |= {alias.asname or alias.name for alias in node.names}
            if below_surface(node.module):
                found.append((node.lineno, upstream, f"from {node.module} import ..."))
                continue
            for alias in node.names:
                sub = module_of(f"{node.module}.{alias.name}")
                if _is_private(alias.name) or (sub and sub[1] and below_surface(f"{node.module}.{alias.name}")):
                    found.append((node.lineno, upstream, f"from {node.module} import {alias.name}"))

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:  # `transformers.trainer_utils.x`
                dotted = bound[value.id]
                for part in chain[:-1]:
                    dotted += f".{part}"
                    sub = module_of(dotted)
                    if sub and sub[1] and below_surface(dotted):
                        found.append((node.lineno, sub[0], dotted))
                        break
            if id(node) not in own and not (isinstance(node.value, ast.Name) and node.value.id in other_modules):
                found += [(node.lineno, u, f".{node.attr}") for u in private(node.attr)]
            if isinstance(node.ctx, (ast.Store, ast.Del)) and node.attr in METHODS and id(node) not in own:
                found.append((node.lineno, REPLACED, f"replaces .{node.attr}"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and len(node.args) > 1:
            name = node.args[1]
            if node.func.id in ("getattr", "setattr", "hasattr", "delattr") and isinstance(name, ast.Constant):
                found += [(node.lineno, u, f"{node.func.id}(..., {name.value!r})") for u in private(str(name.value))]
                if node.func.id in ("setattr", "delattr") and name.value in METHODS:
                    found.append((node.lineno, REPLACED, f"{node.func.id}(..., {name.value!r})"))
        elif isinstance(node, ast.ClassDef):
            bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
            bases |= {b.value.id for b in node.bases if isinstance(b, ast.Attribute) and isinstance(b.value, ast.Name)}
            if not bases & (upstream_names | set(bound)):
                continue
            for item in node.body:
                names = [item.name] if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
                names += [t.id for t in getattr(item, "targets", []) if isinstance(t, ast.Name)]
                found += [(item.lineno, u, f"class attribute {n}") for n in names for u in private(n)]
                for sub in ast.walk(item):  # `self._x` inside a subclass of an upstream class is the upstream's
                    if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "self":
                        found += [(sub.lineno, u, f"self.{sub.attr}") for u in private(sub.attr)]
    return sorted(set(found))


def allowed(path: Path, upstream: str, what: str, package: Path) -> bool:
    """A seam may go below its own upstream's surface, and replace an upstream object's method; grpo_seam.py may
    name the Trainer's and GRPOTrainer's private members (tests/trl_compat/test_trl_seam.py checks those), never
    import below a surface."""
    relative = path.relative_to(package)
    if relative.parent == Path("seams"):
        return relative.stem == upstream or upstream == REPLACED
    return (
        relative == Path("trainer/grpo_seam.py")
        and upstream in ("trl", "transformers")
        and not what.startswith(IMPORTS)
    )


def offenders(package: Path = PACKAGE) -> list[str]:
    """``path:line: upstream: what`` for every use of an upstream's internals outside its seam in ``package``. A
    private name several upstreams define (the Trainer's and DeepSpeed's engine's ``_save_checkpoint``) may be used in
    the seam of any of them."""
    found = []
    for path in sorted(package.rglob("*.py")):
        uses: dict[tuple[int, str], set[str]] = {}
        for line, upstream, what in upstream_uses(path.read_text()):
            uses.setdefault((line, what), set()).add(upstream)
        for (line, what), upstreams in sorted(uses.items()):
            if not any(allowed(path, upstream, what, package) for upstream in upstreams):
                found.append(f"{path.relative_to(package.parent)}:{line}: {'/'.join(sorted(upstreams))}: {what}")
    return found


def test_nothing_outside_the_seams_goes_below_an_upstreams_surface():
    found = offenders()
    print(f"\n{len(found)} upstream internal(s) outside their seams" + "".join(f"\n  {o}" for o in found))
    assert not found, (
        "Upstream internals outside trl_multiagent/seams/ (and grpo_seam.py): move each into its upstream's seam, "
        "with a comment saying what the upstream does there and since which release:\n" + "\n".join(found)
    )


PLANTED = """\
import transformers
import trl.trainer.utils
from accelerate import _private_helper
from peft.tuners.lora import LoraLayer
from trl import GRPOConfig
from trl.trainer.utils import nanstd

class Config(GRPOConfig):
    _VALID_DICT_FIELDS = []
    def check(self):
        return self._n_gpu

def route(layer, state, engine, optimizer, args):
    layer._active_adapter = ["a"]
    state._set_sync_gradients(False)
    engine.module.forward = lambda *a: None
    del engine.module.forward
    optimizer.step = lambda: None
    getattr(engine.optimizer, "grad_partitions_flat_buffer").zero_()
    transformers.trainer_utils.rotate_checkpoints(".")
    self_like = args.hf_deepspeed_config
    return layer.active_adapter

def widen(cls):
    cls._VALID_DICT_FIELDS = [*cls._VALID_DICT_FIELDS, "x"]

class Router:
    def set(self, names):
        self._routing, self._n_gpu, self.forward = names, 1, None
"""


def test_the_check_finds_every_kind_of_planted_offender():
    found = {(line, what) for line, _, what in upstream_uses(PLANTED)}
    assert found >= {
        (2, "import trl.trainer.utils"),
        (3, "from accelerate import _private_helper"),
        (4, "from peft.tuners.lora import ..."),
        (6, "from trl.trainer.utils import ..."),
        (9, "class attribute _VALID_DICT_FIELDS"),
        (11, "self._n_gpu"),
        (14, "._active_adapter"),
        (15, "._set_sync_gradients"),
        (16, "replaces .forward"),
        (17, "replaces .forward"),
        (18, "replaces .step"),
        (19, "getattr(..., 'grad_partitions_flat_buffer')"),
        (20, "transformers.trainer_utils"),
        (21, ".hf_deepspeed_config"),
        (25, "._VALID_DICT_FIELDS"),
    }, sorted(found)
    # public names, and a class's own private attributes outside an upstream subclass, are not offenders
    assert not {line for line, _ in found} & {1, 5, 22, 29}, sorted(found)


def test_a_planted_offender_in_the_package_fails_the_check(tmp_path):
    """The check over a copy of the package, one module given a read of PEFT's private active adapter: that line,
    and only that line, is listed."""
    copy = tmp_path / "trl_multiagent"
    for path in PACKAGE.rglob("*.py"):
        (copy / path.relative_to(PACKAGE)).parent.mkdir(parents=True, exist_ok=True)
        (copy / path.relative_to(PACKAGE)).write_text(path.read_text())
    routing = copy / "adapters" / "routing.py"
    routing.write_text(routing.read_text() + "\n\ndef peek(layer):\n    return layer._active_adapter\n")
    line = len(routing.read_text().splitlines())
    assert offenders(copy) == [f"trl_multiagent/adapters/routing.py:{line}: peft: ._active_adapter"]


def test_the_private_names_hold_what_the_seams_reach():
    """The name sets are read from the installed upstreams: each holds the internals its seam uses."""
    assert "_active_adapter" in PRIVATE["peft"]
    assert "_set_sync_gradients" in PRIVATE["accelerate"]
    assert "_VALID_DICT_FIELDS" in PRIVATE["transformers"] and "_save" in PRIVATE["transformers"]
    assert "_metrics" in PRIVATE["trl"] and "grad_partitions_flat_buffer" in PRIVATE["deepspeed"]
    assert {"forward", "step", "zero_grad"} <= METHODS


@pytest.mark.parametrize("upstream", UPSTREAMS)
def test_every_seam_reaches_below_its_upstreams_surface(upstream):
    """A seam that no longer goes below its upstream's surface is stale: its upstream is used publicly only, and the
    seam goes. The check sees what each seam does (else it could not see an offender elsewhere either)."""
    uses = [what for _, u, what in upstream_uses((SEAMS / f"{upstream}.py").read_text()) if u == upstream]
    assert uses, f"seams/{upstream}.py uses nothing below {upstream}'s public surface"
