"""Proof that every role was served by its own, current adapter.

Two independent checks of each generation batch, both per role:

    provenance   every call carries what the backend stamped (``ModelCall.provenance``: the adapter in the slot the
                 request went to, the optimizer step of the weights loaded there, the backend). The adapter must be
                 the role's routed one and the version the step the trainer synced for this batch: the current step,
                 or the one before when the batch was rolled out ahead. A missed sync shows as an old version, a
                 request sent to another role's slot as another adapter.
    sampler gap  where the backend reports sampling log-probs (vLLM), |trainer log-prob - sampler log-prob| per token
                 against the trainer's log-probs of the same tokens through the same adapter before the update. It
                 catches what no bookkeeping can: a slot that holds other weights than its stamp says (a swapped or
                 evicted LoRA, a load that did not take). A role's mean gap above ``gap_threshold``, or far above the
                 other roles' (``outlier_factor`` x their median, and above the numerical noise), is a mismatch.

Each role with calls logs ``role/<role>/adapter_mismatch`` (1.0 when either check failed this batch, else 0.0),
which ``RoleDriftCallback`` turns into the ``adapter_mismatch`` alarm, and, with sampler log-probs,
``role/<role>/sampler_gap_mean``, ``role/<role>/sampler_gap_max`` and ``role/<role>/sampler_ratio_std`` (the spread
of the sequence-level ratio exp(mean over tokens of trainer - sampler log-prob)). A mismatch is also a warning saying
which adapter was expected at which version and what served it; with ``fail`` it is an ``AdapterMismatchError``.

Thresholds, from the noise measured on the toy model (``benchmarks/sampler_gap_noise.py``, two runs on 2026-12-01,
vLLM 0.32 CPU build, 2-core CPU with other jobs beside it): the toy Qwen3 with two LoRA r=16 role adapters on every
linear layer (B ~ N(0, 0.02)), 48 arithmetic questions per role sampled at temperature 0.7 by vLLM, scored by a
transformers + PEFT forward of the same weights (logits in fp32), mean |gap| per token over runs and roles:

    fp32  noise 4.2e-7 to 6.8e-7, max 1.8e-5, sequence-ratio std at most 6.4e-7
    bf16  noise 4.8e-3 to 8.4e-3, max 0.27, sequence-ratio std at most 5.7e-3
    the other role's adapter (a swapped slot): 0.095 to 0.14 in both dtypes (max 2-5.4, ratio std 0.09-0.13)
    one optimizer step stale (every LoRA weight moved by 1e-3, Adam's first step at lr 1e-3): fp32 3.1e-3 to 7.1e-3,
    bf16 9.5e-3 to 1.0e-2

so the default threshold is 1e-3 in fp32 (over 1,400x the noise, under a third of one stale step) and 3e-2 in
bf16/fp16 (3.6x the largest noise, under a third of a swap); a one-step-stale adapter in bf16 is within 1.5x the
noise, which is why the version stamps are checked exactly. The outlier rule ignores gaps below ``NOISE_FLOOR`` of
the precision (above the largest mean noise measured in it).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from ..rollout.backends.base import Provenance
from ..rollout.backends.served_adapters import other_run
from .role_metrics import role_rows

logger = logging.getLogger(__name__)

# Mean |gap| per token, nats: the defaults of `adapter_mismatch_gap`, and the floor of the outlier rule (above the
# noise measured in each precision; see the module docstring).
GAP_THRESHOLD = {"fp32": 1e-3, "low": 3e-2}
NOISE_FLOOR = {"fp32": 1e-5, "low": 1e-2}


class AdapterMismatchError(RuntimeError):
    """A role was not served by its own adapter at the expected version (``fail_on_adapter_mismatch=True``)."""


@dataclass(frozen=True)
class AdapterMismatch:
    """One role's failed check in one generation batch."""

    step: int  # the trainer's global_step when the batch was checked
    role: str
    adapter: str  # the role's routed adapter
    expected_version: int  # the step whose weights should have sampled the batch
    served: Provenance | None  # the stamp of its first call (the first offending one); None: the backend stamps none
    stamped_wrong: bool  # the stamp itself is not (adapter, expected_version)
    gap: float | None = None  # the role's mean |trainer - sampler| log-prob per token, when it crossed a limit
    gap_limit: float | None = None  # the limit it crossed

    @property
    def message(self) -> str:
        expected = f"adapter {self.adapter!r} at version {self.expected_version}"
        head = f"Adapter mismatch at step {self.step}: role {self.role!r} should be served by {expected}"
        parts = []
        if self.stamped_wrong and (run := other_run(self.served.adapter)) is not None:
            parts.append(
                f"{head}, but its calls were served by {self.served.adapter!r}, an adapter another trainer loaded "
                f"(run tag {run!r}: another run sharing the vLLM server, or this run before it was resumed): the "
                "server mixed up the runs' adapters."
            )
        elif self.stamped_wrong:
            actual = f"adapter {self.served.adapter!r} at version {self.served.version} ({self.served.backend})"
            parts.append(
                f"{head}, but its calls were served by {actual}: a sync to the backend was missed or its LoRA slots "
                "are mapped to the wrong adapters."
            )
        if self.gap is not None:
            stamp = "" if self.served is None else f" (stamped {self.served.adapter!r} v{self.served.version})"
            start = "Its" if parts else f"{head}{stamp}, but the"
            parts.append(
                f"{start} sampler's log-probs differ from that adapter's by {self.gap:.3g} nats per token on average "
                f"(limit {self.gap_limit:.3g}): the backend sampled with other weights (a swapped, evicted or stale "
                "LoRA slot)."
            )
        return " ".join(parts)


def expected_version(step: int, ran_ahead: bool) -> int:
    """The optimizer step whose weights sampled a batch: the current one, or the one before for a batch rolled out
    ahead (``rollout_ahead=1``: synced and started during the previous step)."""
    return step - 1 if ran_ahead else step


def provenance_mismatches(
    calls: Sequence, role_adapters: Mapping[str, str], version: int, step: int
) -> dict[str, AdapterMismatch]:
    """Role -> the first of its calls whose stamp is not (its routed adapter, ``version``). Calls a backend did not
    stamp are not checked, nor the version where the stamp has none (the base model, ``"__base__"``: never trained)."""
    found: dict[str, AdapterMismatch] = {}
    for call in calls:
        served, adapter = call.provenance, role_adapters[call.role]
        if served is None or call.role in found:
            continue
        stale = served.version is not None and served.version != version
        if served.adapter != adapter or stale:
            found[call.role] = AdapterMismatch(step, call.role, adapter, version, served, stamped_wrong=True)
    return found


def sampler_gap_sums(
    roles: Sequence[str], sample_roles: Sequence[str], trainer_logps, sampler_logps, mask
) -> tuple[torch.Tensor, torch.Tensor]:
    """`[R, 5]` per role: sum of |gap| over tokens, tokens, sequences, sum and sum of squares of the sequence-level
    ratio minus 1; and `[R]` the largest |gap| of a token. Logps and mask are `[N, C]`; a NaN sampler log-prob (one
    the server could not send) counts as no gap, as TRL's correction treats it. In float64, the ratio taken as
    expm1: fp32 noise moves it by ~1e-7, which float32 sums of squares would bury."""
    mask = mask.double()
    gap = (trainer_logps.double() - sampler_logps.double()).nan_to_num(0.0) * mask
    tokens = mask.sum(dim=1)
    has_tokens = (tokens > 0).double()
    shifted = torch.expm1(gap.sum(dim=1) / tokens.clamp(min=1)) * has_tokens  # ratio - 1; 0 without tokens
    per_sample = torch.stack([gap.abs().sum(dim=1), tokens, has_tokens, shifted, shifted**2])
    rows = role_rows(roles, sample_roles, gap.device).double()
    largest = (
        (rows[:, :, None] * gap.abs()[None]).flatten(1).amax(dim=1) if gap.numel() else rows.new_zeros(len(roles))
    )
    return rows @ per_sample.T, largest


def sampler_gap_metrics(roles: Sequence[str], sums: torch.Tensor, largest: torch.Tensor) -> dict[str, float]:
    """``role/<role>/sampler_gap_mean|_max`` and ``sampler_ratio_std`` of each role with tokens."""
    metrics = {}
    for role, (gap, tokens, sequences, ratio, square), top in zip(roles, sums.tolist(), largest.tolist()):
        if tokens:
            mean = ratio / sequences
            metrics[f"role/{role}/sampler_gap_mean"] = gap / tokens
            metrics[f"role/{role}/sampler_gap_max"] = top
            metrics[f"role/{role}/sampler_ratio_std"] = max(square / sequences - mean**2, 0.0) ** 0.5
    return metrics


def gap_outliers(gaps: Mapping[str, float], threshold: float, outlier_factor: float, floor: float) -> dict:
    """Role -> the limit its mean gap crossed: ``threshold``, or ``outlier_factor`` x the median of the other roles'
    gaps when that is above ``floor`` too."""
    crossed = {}
    for role, gap in gaps.items():
        others = sorted(g for r, g in gaps.items() if r != role)
        if gap > threshold:
            crossed[role] = threshold
        elif others:
            middle = len(others) // 2
            median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
            limit = max(outlier_factor * median, floor)
            if gap > limit:
                crossed[role] = limit
    return crossed


class AdapterCheck:
    """Checks each generation batch's calls (see the module docstring); ``low_precision``: the trained weights or the
    sampler run in bf16/fp16, whose noise sets the default threshold and floor; ``dropout``: the trainer's log-probs
    carry dropout noise (LoRA dropout), so the default fixed threshold does not apply."""

    def __init__(
        self,
        roles: Sequence[str],
        role_adapters: Mapping[str, str],
        *,
        gap_threshold: float | None,
        outlier_factor: float,
        fail: bool,
        low_precision: bool,
        dropout: bool = False,
    ):
        if gap_threshold is not None and not gap_threshold > 0:
            raise ValueError("`adapter_mismatch_gap` is a mean gap in nats per token: use a value > 0 or None.")
        if not outlier_factor > 1:
            raise ValueError("`adapter_mismatch_outlier` compares a role with the others' median: use a factor > 1.")
        precision = "low" if low_precision else "fp32"
        self.roles, self.role_adapters, self.fail = list(roles), dict(role_adapters), fail
        self.gap_threshold = GAP_THRESHOLD[precision] if gap_threshold is None else gap_threshold
        if dropout and gap_threshold is None:
            # The trainer's log-probs are those of the loss, in training mode: dropout moves them by far more than
            # the noise the default was measured at. Only the comparison between roles stays meaningful.
            self.gap_threshold = float("inf")
            logger.info(
                "Dropout is active in the trained model: the sampler gap is checked only between roles "
                "(adapter_mismatch_outlier); set adapter_mismatch_gap to check it against a fixed limit too."
            )
        self.outlier_factor, self.floor = outlier_factor, NOISE_FLOOR[precision]
        self._warned: set[str] = set()  # roles warned about and not yet clear (warned again after a clear batch)
        self._unstamped_said = False

    @classmethod
    def for_run(cls, args, roles: Sequence[str], role_adapters: Mapping[str, str], model) -> AdapterCheck:
        """The check a ``MultiAgentGRPOConfig`` asks for; ``model`` (the trained one) tells its precision."""
        low = args.bf16 or args.fp16 or getattr(model, "dtype", None) in (torch.bfloat16, torch.float16)
        dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
        return cls(
            roles,
            role_adapters,
            gap_threshold=args.adapter_mismatch_gap,
            outlier_factor=args.adapter_mismatch_outlier,
            fail=args.fail_on_adapter_mismatch,
            low_precision=low,
            dropout=dropout,
        )

    def check(
        self,
        *,
        calls: Sequence,
        batch,
        trainer_logps: torch.Tensor | None,
        step: int,
        ran_ahead: bool,
        gather: Callable[[torch.Tensor], torch.Tensor],
    ) -> dict[str, float]:
        """The metrics of one generation batch (``calls``: this process's, in ``batch``'s sample order;
        ``trainer_logps``: `[N, C]` the trainer's log-probs before the update, None when the backend reported no
        sampling log-probs; ``gather``: concatenates a tensor over processes). Every process gets the same verdict."""
        version = expected_version(step, ran_ahead)
        found = provenance_mismatches(calls, self.role_adapters, version, step)
        if calls and all(c.provenance is None for c in calls) and not self._unstamped_said:
            self._unstamped_said = True
            logger.info("The rollout backend stamps no provenance on its calls: adapter versions are not checked.")
        device = batch.completion_mask.device
        flagged = gather(torch.tensor([[float(r in found) for r in self.roles]], device=device)).sum(0)
        metrics: dict[str, float] = {}
        if trainer_logps is not None:
            sums, largest = sampler_gap_sums(
                self.roles, batch.roles, trainer_logps, batch.sampling_per_token_logps, batch.completion_mask
            )
            sums, largest = gather(sums[None]).sum(0), gather(largest[None]).amax(0)
            metrics = sampler_gap_metrics(self.roles, sums, largest)
            gaps = {r: v for r in self.roles if (v := metrics.get(f"role/{r}/sampler_gap_mean")) is not None}
            for role, limit in gap_outliers(gaps, self.gap_threshold, self.outlier_factor, self.floor).items():
                if role in found:
                    found[role] = dataclasses.replace(found[role], gap=gaps[role], gap_limit=limit)
                    continue
                stamps = [c.provenance for c in calls if c.role == role and c.provenance is not None]
                stamp = stamps[0] if stamps else None
                adapter = self.role_adapters[role]
                found[role] = AdapterMismatch(step, role, adapter, version, stamp, False, gaps[role], limit)
        counts = gather(torch.tensor([[float(sum(c.role == r for c in calls)) for r in self.roles]], device=device))
        mismatched = [r for r, f in zip(self.roles, flagged.tolist()) if f or r in found]
        for role, calls_made in zip(self.roles, counts.sum(0).tolist()):
            if calls_made:
                metrics[f"role/{role}/adapter_mismatch"] = float(role in mismatched)
        self._report(found, mismatched, step)
        return metrics

    def _report(self, found: dict[str, AdapterMismatch], mismatched: list[str], step: int) -> None:
        elsewhere = "(seen by another process, whose log names the adapter and the versions)"
        messages = [
            found[r].message if r in found else f"Adapter mismatch at step {step}: role {r!r} {elsewhere}."
            for r in mismatched
        ]
        if self.fail and messages:
            raise AdapterMismatchError(" ".join(messages))
        for role, message in zip(mismatched, messages):
            if role not in self._warned:
                logger.warning(message)
        self._warned = set(mismatched)
