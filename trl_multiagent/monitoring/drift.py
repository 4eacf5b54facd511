"""Early warnings from per-role metrics: the drift signatures the paper saw before, or instead of, an accuracy drop.

Under shared policies the role with the most tokens captures the adapter (a judge starts writing code or re-solving
the problem; a synthesizer's median output collapses while its p95 hits the length cap); under isolated policies one
role's perplexity rises before accuracy falls. None of it shows in the global reward curve. ``RoleDriftCallback``
watches the ``role/<role>/...`` and ``workflow/...`` values the trainer logs and raises an alarm when it sees one.
"""

from __future__ import annotations

import logging
import math
import shlex
import statistics
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ..workflows.formats import OutputFormat
from .alarm_advice import advised_flags, alarm_advice

logger = logging.getLogger(__name__)

JUDGE_KINDS = ("verdict", "selection")  # declared output formats whose roles judge other roles' answers

# Why each kind of alarm matters, appended to its warning.
_MEANING = {
    "judge_code": "the judge writes code blocks instead of verdicts (SP role capture; the paper's code Eval-Opt)",
    "judge_length": "the judge writes solver-length outputs, i.e. re-solves the problem (SP role capture)",
    "length_drift": "the role's median output length moved far from its early-training value",
    "length_cap": "the role's outputs hit the length cap (p95 at the cap), often with a collapsing median",
    "perplexity_rise": "one role's perplexity rose while accuracy has not fallen yet: the paper's early warning",
    "entropy_rise": "one role's entropy rose while accuracy has not fallen yet: the paper's early warning",
    "judge_base_rate": "the judge's verdicts follow the base rate (balanced accuracy near 0.5) while its raw accuracy "
    "looks fine: it gives the common verdict instead of judging",
    "adapter_mismatch": "the role's calls were not sampled by its own adapter at the version trained (a missed sync, "
    "a swapped or evicted LoRA slot); the trainer's warning names the adapter and the versions",
}


def alarm_meaning(kind: str) -> str:
    """What an alarm of ``kind`` says about the role (its warning's explanation); "" for an unknown kind."""
    return _MEANING.get(kind, "")


@dataclass
class DriftThresholds:
    """When ``RoleDriftCallback`` raises each alarm. Ratios compare a logged value with its baseline, the mean of
    the metric's first ``baseline_steps`` logged values."""

    judge_code_fraction: float = field(
        default=0.5,
        metadata={"help": "judge_code: a judge role's `code_block_fraction` above this."},
    )
    judge_solver_length_ratio: float = field(
        default=0.75,
        metadata={
            "help": "judge_length: a judge role's `words_median` above this times the mean `words_median` of the "
            "solver roles logged with it. Judges normally write a fraction of a solution (the paper's math evaluator: "
            "131 words) and grow to solver length when captured (986 words)."
        },
    )
    length_drift_factor: float = field(
        default=3.0,
        metadata={
            "help": "length_drift: a role's `words_median` or `completion_length` above this times its baseline, or "
            "below the baseline divided by it (the paper's synthesizer: 369 -> 19 words)."
        },
    )
    truncated_fraction: float = field(
        default=0.05,
        metadata={
            "help": "length_cap: a role's `truncated_fraction`, averaged over its last `baseline_steps` logs, above "
            "this; above 0.05 the role's p95 length is at the cap. (A tail rate: one step of a small batch, e.g. "
            "3 truncations in 32 calls, is mostly noise.)"
        },
    )
    uncertainty_rise_factor: float = field(
        default=1.5,
        metadata={"help": "perplexity_rise / entropy_rise: a role's `perplexity` or `entropy` above this x baseline."},
    )
    entropy_min_rise: float = field(
        default=0.05,
        metadata={
            "help": "entropy_rise also needs the entropy this many nats per token above its baseline: a near-"
            "deterministic role's entropy (the toy evaluator: 0.037) doubles from one small batch to the next by "
            "sampling noise alone, which is not the spike the research reports."
        },
    )
    success_tolerance: float = field(
        default=0.05,
        metadata={
            "help": "perplexity_rise / entropy_rise fire only while `workflow/success` >= its baseline minus this "
            "(accuracy has not fallen yet)."
        },
    )
    judge_balanced_accuracy: float = field(
        default=0.6,
        metadata={
            "help": "judge_base_rate: a verdict role's `verdict_balanced_accuracy`, averaged over its last "
            "`baseline_steps` logs, at or below this (0.5: the verdict says nothing about the answer)..."
        },
    )
    judge_raw_accuracy: float = field(
        default=0.7,
        metadata={
            "help": "... while its `verdict_accuracy`, averaged alike, is at least this: raw accuracy that looks "
            "fine because most judged answers are of one kind (the toy Eval-Opt: 91.5% 'Correct' on a generator "
            "right 89% of the time)."
        },
    )
    baseline_steps: int = field(
        default=3,
        metadata={"help": "How many of a metric's first logged values are averaged into its baseline."},
    )

    def __post_init__(self) -> None:
        for name in ("judge_balanced_accuracy", "judge_raw_accuracy"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"DriftThresholds.{name} is an accuracy; use a value in [0, 1].")
        for name in ("judge_code_fraction", "truncated_fraction"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"DriftThresholds.{name} is a fraction of outputs; use a value in [0, 1).")
        if self.judge_solver_length_ratio <= 0:
            raise ValueError("DriftThresholds.judge_solver_length_ratio must be > 0 (e.g. 0.75).")
        for name in ("length_drift_factor", "uncertainty_rise_factor"):
            if getattr(self, name) <= 1.0:
                raise ValueError(f"DriftThresholds.{name} compares with a baseline; use a factor > 1 (e.g. 1.5 or 3).")
        if self.success_tolerance < 0:
            raise ValueError("DriftThresholds.success_tolerance must be >= 0 (0 means any drop counts as a fall).")
        if self.baseline_steps < 1:
            raise ValueError("DriftThresholds.baseline_steps must be >= 1 logged step.")


@dataclass(frozen=True)
class DriftAlarm:
    """One alarm: which role showed which signature, in which logged metric, and when."""

    step: int  # state.global_step of the log that raised it
    role: str
    kind: str  # a key of _MEANING: judge_code, length_drift, perplexity_rise, adapter_mismatch, ...
    metric: str  # the logged key that crossed, e.g. "role/evaluator/code_block_fraction"
    value: float
    threshold: float  # the value it crossed (for a downward length drift, the lower bound)

    @property
    def message(self) -> str:
        return (
            f"Role drift at step {self.step}: role {self.role!r} {self.kind}: {self.metric} = {self.value:.4g} "
            f"crossed {self.threshold:.4g}; {_MEANING[self.kind]}. {alarm_advice(self.kind, self.role)}"
        ).rstrip()


def stop_message(alarms: list[DriftAlarm], resume: Callable[[Sequence[str]], str] | None) -> str:
    """What a run stopped by ``alarms`` (``stop_on_drift``) says: ``resume(flags)``, how to resume it with the
    command-line flags of the settings the alarms' advice names."""
    flags = advised_flags((alarm.role, alarm.kind) for alarm in alarms)
    kinds = ", ".join(f"{alarm.role!r} {alarm.kind}" for alarm in alarms)
    head = f"Training stops at step {alarms[0].step} on drift alarm(s) {kinds} (`stop_on_drift=True`)."
    if resume is None:
        return head
    settings = f" The command carries the advised setting(s) ({shlex.join(flags)})." if flags else ""
    return f"{head} {resume(flags)}{settings}"


class RoleDriftCallback(TrainerCallback):
    """Raises an alarm when a role shows one of the paper's drift signatures in the logged metrics.

    Kinds, checked at every log of ``role/<role>/...`` metrics (the trainer's own and ``workflow_metrics``'s), once
    the role has a starting window (its first ``baseline_steps`` logged values), against that window:

    - ``judge_code``: a judge role's ``code_block_fraction`` > ``judge_code_fraction``.
    - ``judge_length``: a judge role's ``words_median`` > ``judge_solver_length_ratio`` x the mean ``words_median``
      of the solver roles in the same log.
    - ``length_drift``: any role's ``words_median`` or ``completion_length`` beyond ``length_drift_factor`` times
      its baseline, up or down.
    - ``length_cap``: any role's ``truncated_fraction``, averaged over its last ``baseline_steps`` logs, >
      ``truncated_fraction``.
    - ``perplexity_rise`` / ``entropy_rise``: a role's ``perplexity`` / ``entropy`` > ``uncertainty_rise_factor``
      x its baseline (entropy also ``entropy_min_rise`` above it) while ``workflow/success`` is still >= its
      baseline - ``success_tolerance`` (or not logged).
    - ``judge_base_rate``: a verdict role's ``verdict_balanced_accuracy`` <= ``judge_balanced_accuracy`` while its
      ``verdict_accuracy`` >= ``judge_raw_accuracy``, both averaged over its last ``baseline_steps`` logs (the
      balanced accuracy is logged only for batches holding both right and wrong judged answers).
    - ``adapter_mismatch``: a role's ``adapter_mismatch`` > 0: in a logged step, its calls were not served by its
      own adapter at the expected version (``monitoring/adapter_check.py`` decides, per generation batch, from the
      backend's stamps and the sampler gap; no baseline needed, so it can fire at the first step).

    The fixed thresholds (``judge_code``, ``judge_length``, ``length_cap``, ``judge_base_rate``) are the research's
    signatures of a role *changing*: a role whose starting window is already past one (e.g. the toy evaluator, which
    cites every line of the solution it judges, so writes about as much as the generator) does so by design, not by
    drift. That kind is then not watched for that role (said once at INFO level); its lengths are still watched by
    ``length_drift``.

    An alarm is a ``logger.warning`` (main process), a ``DriftAlarm`` appended to ``self.alarms``, and
    ``alarm/<role>/<kind> = 1.0`` added to the logs and to the log's ``state.log_history`` entry; with
    ``stop_on_alarm`` it also sets ``control.should_training_stop``. A (role, kind) alarms once, then again only
    after a log in which its condition was checked and clear.

    ``Trainer(callbacks=[...])`` and ``add_callback`` put the callback after the ``report_to`` integrations, which
    have then already sent the log; for wandb/trackio/tensorboard to see the alarm keys, put it first:
    ``trainer.callback_handler.callbacks.insert(0, RoleDriftCallback())``.

    Judges and solvers are the roles the workflow declares so (``formats``, role type -> ``OutputFormat``, e.g.
    ``workflow.formats``; the trainer passes its workflow's): a role whose format is a verdict or a selection judges,
    one whose format is an answer solves, whatever their names. Without ``formats`` no role is a judge, so
    ``judge_code`` and ``judge_length`` are not checked.

    Args:
        thresholds: the alarm thresholds; ``DriftThresholds()`` by default.
        formats: the workflow's declared role formats, which tell judges and solvers apart.
        stop_on_alarm: stop training at the first alarm (the checkpoint before the drift is kept).
        resume: with ``stop_on_alarm``, ``resume(flags)`` says how to resume the run with the command-line
            ``flags`` of the alarm's advised setting (monitoring/alarm_advice.py); the trainer passes the command that
            resumes from the run's newest checkpoint (checkpoints/resume_command.py). The stop prints it after the
            alarm's warning.
    """

    def __init__(
        self,
        thresholds: DriftThresholds | None = None,
        formats: Mapping[str, OutputFormat] | None = None,
        stop_on_alarm: bool = False,
        resume: Callable[[Sequence[str]], str] | None = None,
    ) -> None:
        self.thresholds = thresholds or DriftThresholds()
        kinds = {role: fmt.kind for role, fmt in (formats or {}).items()}
        self.judge_roles = frozenset(role for role, kind in kinds.items() if kind in JUDGE_KINDS)
        self.solver_roles = frozenset(role for role, kind in kinds.items() if kind == "answer")
        self.stop_on_alarm = stop_on_alarm
        self.resume = resume
        self.alarms: list[DriftAlarm] = []
        self._early: dict[str, list[float]] = defaultdict(list)  # metric -> its first `baseline_steps` values
        self._recent: dict[str, deque[float]] = {}  # metric -> its last `baseline_steps` values (length_cap)
        self._active: set[tuple[str, str]] = set()  # (role, kind) alarmed and not yet clear
        self.unwatched: set[tuple[str, str]] = set()  # (role, kind) whose starting window was past the threshold

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs,
    ) -> TrainerControl:
        new = self.observe(logs or {}, state.global_step)
        if not new:
            return control
        keys = {f"alarm/{alarm.role}/{alarm.kind}": 1.0 for alarm in new}
        logs.update(keys)
        # Trainer.log stored a copy of the logs in log_history before calling the callbacks; the alarms belong there
        # too, so trainer_state.json keeps them.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(keys)
        if state.is_world_process_zero:
            for alarm in new:
                logger.warning(alarm.message)
        if self.stop_on_alarm:
            control.should_training_stop = True
            if state.is_world_process_zero:  # before this step's own checkpoint, if one is due, is written
                logger.warning(stop_message(new, self.resume))
        return control

    def observe(self, logs: dict[str, float], step: int) -> list[DriftAlarm]:
        """Check one log for drift and update the baselines; returns the alarms this log raised (also kept in
        ``self.alarms``). ``on_log`` calls it; call it directly to check logs without a Trainer."""
        values = {
            key: float(value)
            for key, value in logs.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        }
        roles = {key.split("/")[1] for key in values if key.startswith("role/") and key.count("/") >= 2}
        for role in roles & self.judge_roles:  # judge_length compares with the solvers of the same log
            solver = [values[key] for r in self.solver_roles if (key := f"role/{r}/words_median") in values]
            if solver and statistics.fmean(solver) > 0 and f"role/{role}/words_median" in values:
                values[_solver_ratio(role)] = values[f"role/{role}/words_median"] / statistics.fmean(solver)
        new = []
        for role in sorted(roles):
            for kind, crossing in self._check_role(role, values).items():
                if crossing is None:  # checked and clear
                    self._active.discard((role, kind))
                elif (role, kind) not in self._active:
                    self._active.add((role, kind))
                    new.append(DriftAlarm(step, role, kind, *crossing))
        for key, value in values.items():  # after the checks: a baseline never includes the value it judges
            if len(self._early[key]) < self.thresholds.baseline_steps:
                self._early[key].append(value)
            self._recent.setdefault(key, deque(maxlen=self.thresholds.baseline_steps)).append(value)
        self.alarms += new
        return new

    def _check_role(self, role: str, values: dict[str, float]) -> dict[str, tuple[str, float, float] | None]:
        """Kind -> ``(metric, value, threshold)`` where the role crosses, ``None`` where it was checked and is clear;
        kinds whose metrics are missing from the log (or lack a baseline yet) are left out."""
        t = self.thresholds
        checks: dict[str, tuple[str, float, float] | None] = {}

        def above(kind: str, metric: str, threshold: float, reported: str | None = None) -> None:
            key = metric if "/" in metric else f"role/{role}/{metric}"
            if key in values and checks.get(kind) is None:
                checks[kind] = (reported or key, values[key], threshold) if values[key] > threshold else None

        def signature(
            kind: str, metric: str, threshold: float, measured: str, limit: float, reported: str | None = None
        ) -> None:
            """A fixed threshold: watched once ``measured``'s starting window exists and was within ``limit``."""
            start = self._baseline(measured)
            if start is None or (role, kind) in self.unwatched:
                return
            if start > limit:
                self.unwatched.add((role, kind))
                logger.info(
                    "Role %r starts past the %s threshold (%s = %.4g in its first %d logs > %.4g): its starting "
                    "behaviour, so %s is not watched for it (length_drift still is).",
                    role,
                    kind,
                    measured,
                    start,
                    t.baseline_steps,
                    limit,
                    kind,
                )
                return
            above(kind, metric, threshold, reported)

        above("adapter_mismatch", "adapter_mismatch", 0.0)
        if role in self.judge_roles:
            code = f"role/{role}/code_block_fraction"
            signature("judge_code", "code_block_fraction", t.judge_code_fraction, code, t.judge_code_fraction)
            if _solver_ratio(role) in values:
                solvers = values[f"role/{role}/words_median"] / values[_solver_ratio(role)]
                limit = t.judge_solver_length_ratio
                signature("judge_length", "words_median", limit * solvers, _solver_ratio(role), limit)
        cap = f"role/{role}/truncated_fraction"
        if cap in values:  # judged on its mean over the last `baseline_steps` logs, this one included
            recent = [*self._recent.get(cap, ()), values[cap]][-t.baseline_steps :]
            values[_recent_mean(role)] = statistics.fmean(recent)
            signature("length_cap", _recent_mean(role), t.truncated_fraction, cap, t.truncated_fraction, reported=cap)
        balanced, raw = f"role/{role}/verdict_balanced_accuracy", f"role/{role}/verdict_accuracy"
        if balanced in values and raw in values:  # judged on their means over the last `baseline_steps` logs
            for key in (balanced, raw):
                values[_recent(key)] = statistics.fmean([*self._recent.get(key, ()), values[key]][-t.baseline_steps :])
            start, limit = self._baseline(balanced), t.judge_balanced_accuracy
            watched = start is not None and (role, "judge_base_rate") not in self.unwatched
            if watched and start <= limit:
                self.unwatched.add((role, "judge_base_rate"))
                what = f"{balanced} = {start:.4g} in its first {t.baseline_steps} logs <= {limit:.4g}"
                logger.info("Role %r starts at the base rate (%s): judge_base_rate is not watched for it.", role, what)
            elif watched:
                recent = values[_recent(balanced)]
                at_base_rate = recent <= limit and values[_recent(raw)] >= t.judge_raw_accuracy
                checks["judge_base_rate"] = (balanced, recent, limit) if at_base_rate else None
        for metric in ("words_median", "completion_length"):
            key, baseline = f"role/{role}/{metric}", self._baseline(f"role/{role}/{metric}")
            if key in values and baseline and checks.get("length_drift") is None:  # a zero baseline has no ratio
                high, low = t.length_drift_factor * baseline, baseline / t.length_drift_factor
                value = values[key]
                crossed = high if value > high else low if value < low else None
                checks["length_drift"] = None if crossed is None else (key, value, crossed)
        success, success_baseline = values.get("workflow/success"), self._baseline("workflow/success")
        fallen = None not in (success, success_baseline) and success < success_baseline - t.success_tolerance
        for metric in ("perplexity", "entropy"):
            key, baseline = f"role/{role}/{metric}", self._baseline(f"role/{role}/{metric}")
            if key in values and baseline:
                if fallen:  # no longer an early warning: accuracy already fell, which the reward curve shows
                    checks[f"{metric}_rise"] = None
                else:
                    floor = baseline + t.entropy_min_rise if metric == "entropy" else 0.0
                    above(f"{metric}_rise", metric, max(t.uncertainty_rise_factor * baseline, floor))
        return checks

    def _baseline(self, key: str) -> float | None:
        """The mean of the metric's starting window, once it has ``baseline_steps`` values."""
        early = self._early.get(key, [])
        return statistics.fmean(early) if len(early) == self.thresholds.baseline_steps else None


def _solver_ratio(role: str) -> str:
    """Internal key of a judge's words_median over the solvers' mean in the same log (never logged)."""
    return f"_judge_solver_ratio/{role}"


def _recent(key: str) -> str:
    """Internal key of a logged metric averaged over its last logs, this one included (never logged)."""
    return f"_recent/{key}"


def _recent_mean(role: str) -> str:
    """Internal key of a role's truncated_fraction averaged over its last logs (reported under the logged key)."""
    return f"_recent_truncated_fraction/{role}"
