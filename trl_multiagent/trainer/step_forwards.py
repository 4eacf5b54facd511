"""``StepForwards``: the forwards of a training step, every sample routed to its adapter, and the updates they make.

The trainer's TRL hooks delegate here (multiagent_grpo_trainer.py): `_micro_step_inputs` has a generation batch cut
into the micro-steps of its optimizer steps (``micro_steps_of``); `training_step` has each micro-step split into
memory-bounded forwards (``micro_batches``) whose gradients add up (``accumulate``), or, under
`update_schedule="mini_batches"`, every mini-batch's update run (``mini_batch_update``); `compute_loss` routes its
samples to their adapters (``route``) and `_logps_and_entropies` lays their rows out without a mask (``laid_out``).
The log-probs before an update (logps_before_update.py) are ``routed_logps``: every sample through the adapter given.

How forwards are bounded and laid out is training/forwards.py's and training/row_layout.py's; the optimizer steps over
the adapters are adapters/clip_and_step.py's. What changes while the trainer runs (its model, the optimizer, the
accumulation steps) is read when called or passed in; TRL's own forward and backward, and the trainer's log-prob hook,
are called, never copied.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import torch
from accelerate import Accelerator
from accelerate.utils import gather, gather_object

from ..adapters.clip_and_step import AdapterSteps
from ..adapters.updates import AdapterUpdates
from ..config import MultiAgentGRPOConfig
from ..monitoring.training_metrics import TrainingMetrics
from ..seams.accelerate import gradients_synced
from ..seams.deepspeed import clear_zero3_gradients
from ..seams.transformers import attention_implementation
from ..training.batch import TrainingBatch
from ..training.forwards import Forwards
from ..training.loss_weights import loss_ready
from ..training.mini_batches import micro_steps, mini_batch_plan
from ..training.row_layout import LaidOut, layout_for, rows_by_adapter
from .logps_before_update import LogpsBeforeUpdate


class StepForwards:
    """A training step's forwards over routed samples: micro-steps, their memory-bounded forwards and backwards, the
    mini-batch updates, and the log-prob forwards before an update."""

    def __init__(
        self,
        args: MultiAgentGRPOConfig,
        *,
        model: Callable[[], torch.nn.Module],
        accelerator: Accelerator,
        updates: AdapterUpdates,
        adapter_steps: AdapterSteps,
        before_update: LogpsBeforeUpdate,
        step_metrics: TrainingMetrics,
        loss_type: str,
        num_generations: int,
        pad_token_id: int,
        router_loss: bool,
        deepspeed: bool,
        logps_and_entropies: Callable,
        trl_training_step: Callable[[torch.nn.Module, TrainingBatch, object], torch.Tensor],
        accumulating: Callable[[torch.nn.Module], AbstractContextManager],
        clip: Callable[[torch.nn.Module], torch.Tensor],
        record: Callable[[str, dict[str, float]], None],
    ):
        """``model()``: the trainer's model now; ``router_loss``: TRL's loss adds a MoE router loss
        (`aux_loss_enabled`), which needs the padding mask; ``deepspeed``: the engine steps and clips;
        ``logps_and_entropies``: the trainer's log-prob hook (`_logps_and_entropies`); ``trl_training_step``: TRL's
        forward and backward of one loss-ready batch (its `training_step`); ``accumulating(model)``: backwards that
        add to the gradients without ending the micro-step; ``clip(model)``: the trainer's clipping before an optimizer
        step; ``record(mode, values)``: TRL's metric store."""
        self.args, self.model, self.accelerator = args, model, accelerator
        self.updates, self.adapter_steps = updates, adapter_steps
        self.before_update, self.step_metrics = before_update, step_metrics
        self.loss_type, self.num_generations, self.pad_token_id = loss_type, num_generations, pad_token_id
        self.router_loss, self.deepspeed = router_loss, deepspeed
        self.logps_and_entropies, self.trl_training_step = logps_and_entropies, trl_training_step
        self.accumulating, self.clip, self.record = accumulating, clip, record
        self.routed_samples: tuple | None = None  # (router, adapter of each sample) of the forward about to run

    # ------------------------------------------------------------------------------------ how forwards are laid out
    def forward_layout(self) -> str:
        """Packed where the attention reads packed samples without a dense mask; one sample a row elsewhere, and
        always for a MoE router loss, which needs the padding mask (training/row_layout.py)."""
        if self.router_loss:
            return "rows"
        return layout_for(attention_implementation(self.model().config))

    def forwards(self, mode: str, *, backward: bool = False) -> Forwards:
        """How this run's forwards are bounded and laid out (training/forwards.py), as the trainer is now."""
        several = self.accelerator.num_processes > 1
        return Forwards.for_run(
            self.args,
            mode=mode,
            backward=backward,
            model=self.model(),
            layout=self.forward_layout(),
            loss_type=self.loss_type,
            pad_token_id=self.pad_token_id,
            alignment=self.updates.alignment,
            most_over_processes=(lambda t: gather(t[None]).max(dim=0).values) if several else None,
        )

    def route(self, batch: TrainingBatch, model: torch.nn.Module, *, training: bool) -> torch.nn.Module:
        """The base model ``batch``'s samples sit on, every sample routed to its adapter. The routing stays set
        through backward, so checkpointed layers recompute with the same adapters."""
        model, router = self.updates.routing.forward_target(batch.adapters, model)
        names = self.updates.routing.names(batch.adapters, batch.roles, training)
        self.routed_samples = (router, names)
        router.set(names)
        return model

    def laid_out(self, input_ids, attention_mask, logits_to_keep: int, *, padding_mask: bool) -> LaidOut:
        """The rows of the forward about to run, without an attention mask: one sample a row, or packed, a row per
        adapter (training/row_layout.py), routed row by row as long as the forward lasts (its backward included);
        ``padding_mask``: the model needs one (a MoE router loss)."""
        layout, row_of = self.forward_layout(), None
        router, names = self.routed_samples or (None, None)
        self.routed_samples = None  # said for this forward only
        if layout == "packed" and (names is None or len(names) != len(input_ids)):
            layout = "rows"  # a forward whose routing is not known here: its rows as they are routed
        if layout == "packed":
            row_names, row_of = rows_by_adapter(names)
            router.set(row_names)
        return LaidOut.of(
            input_ids,
            attention_mask,
            logits_to_keep,
            layout=layout,
            pad_to_multiple_of=self.args.pad_to_multiple_of,
            padding_mask=padding_mask,
            pad_token_id=self.pad_token_id,
            row_of=row_of,
        )

    def routed_logps(self, batch: TrainingBatch, adapters: list[str], mode: str) -> torch.Tensor:
        """`[N, C]` log-probs of every sample through ``adapters``, in memory-bounded forwards."""

        def forward(part: TrainingBatch, names: list[str]) -> torch.Tensor:
            model, router = self.updates.routing.forward_target(part.adapters, self.model())
            with router.route(names):
                self.routed_samples = (router, names)
                return self.logps_and_entropies(model, *part.model_inputs())[0]

        keys = self.updates.routing.forward_keys(batch.adapters)
        return self.forwards(mode).routed_logps(batch, adapters, keys=keys, forward=forward)

    # --------------------------------------------------------------------------------------- micro-steps
    def micro_steps_of(self, batch: TrainingBatch) -> list[TrainingBatch]:
        """A generation batch shuffled and cut into near-equal micro-steps, none dropped, each sample weighed exactly
        (loss_weights.py), each optimizer step's rows sorted by length so that its forwards pad little
        (mini_batches.py); loss-ready. Records the samples trained over every process."""
        args = self.args
        chunks = micro_steps(
            batch.shuffled(),
            steps=args.steps_per_generation,
            accumulation=args.gradient_accumulation_steps,
            loss_type=self.loss_type,
            num_processes=self.accelerator.num_processes,
        )
        ready = [loss_ready(chunk, self.loss_type) for chunk in chunks]
        trained = gather(torch.tensor([sum(map(len, chunks))], device=self.accelerator.device)).sum()
        self.record("train", {"workflow/samples_trained": float(trained)})
        return ready

    def micro_batches(self, batch: TrainingBatch) -> list[TrainingBatch]:
        """One micro-step's memory-bounded loss forwards, alike on every process (training/forwards.py)."""
        forwards = self.forwards("train", backward=True)
        return forwards.loss_forwards(batch, self.updates.routing.forward_keys(batch.adapters))

    def evaluation_forwards(self, batch: TrainingBatch) -> list[TrainingBatch]:
        """An evaluation batch's loss forwards (loss-ready); their losses add up to the batch's."""
        keys = self.updates.routing.forward_keys(batch.adapters)
        return self.forwards("eval").evaluation_forwards(loss_ready(batch, self.loss_type), keys)

    # ------------------------------------------------------------------------------------------ the updates
    def accumulate(self, model, parts: list[TrainingBatch], num_items_in_batch, engine_steps=False) -> torch.Tensor:
        """Forward and backward each part; only the last one synchronises gradients across processes (and, under
        DeepSpeed, is followed by the engine's optimizer step: one per micro-step, as without DeepSpeed, or, with
        ``engine_steps``, one after these parts, as a mini-batch's step)."""
        loss = torch.zeros((), device=self.accelerator.device)
        forwards, bases = self.forwards("train", backward=True), list(self.updates.installed.models.values())
        for i, part in enumerate(parts):
            if i < len(parts) - 1:
                context = self.accumulating(model)
            else:
                context = gradients_synced(self.accelerator) if engine_steps else nullcontext()
            checkpointing = self.args.gradient_checkpointing_kwargs  # off where this forward fits the memory
            with context, forwards.recompute(part, models=bases, gradient_checkpointing_kwargs=checkpointing):
                loss = loss + self.trl_training_step(model, part, num_items_in_batch)
        if engine_steps or (self.deepspeed and self.accelerator.sync_gradients):  # the engine stepped
            clear_zero3_gradients(model)
        return loss

    def mini_batch_update(
        self, model, batch: TrainingBatch, num_items_in_batch, *, optimizer, accumulation_steps: int
    ) -> tuple[torch.Tensor, list[float]]:
        """`update_schedule="mini_batches"`: a generation batch cut into each adapter's mini-batches, each trained in
        its forwards; every mini-batch but the last takes its optimizer step here (adapters/clip_and_step.py), the
        last one takes the Trainer's own step. Returns the loss and the norms before clipping of the steps taken."""
        args = self.args
        prompts = args.mini_batch_prompts or args.generation_batch_size // self.num_generations
        plan = mini_batch_plan(
            batch,
            self.updates.installed.adapter_names,
            mini_batch_size=prompts * self.num_generations,
            num_processes=self.accelerator.num_processes,
            sum_over_processes=lambda t: self.accelerator.reduce(t, reduction="sum"),
            loss_type=self.loss_type,
            accumulation_steps=accumulation_steps,
            order=args.mini_batch_order,
            gather_object=gather_object,
        )
        plan = self.before_update.add_to_mini_batches(batch, plan)  # each adapter's first mini-batch needs none

        def train(part: TrainingBatch) -> torch.Tensor:
            parts = self.micro_batches(loss_ready(part, self.loss_type))
            return self.accumulate(model, parts, num_items_in_batch, engine_steps=self.deepspeed)

        clip = functools.partial(self.clip, model)  # under DeepSpeed: the engine's norm of its step
        losses, norms = self.adapter_steps.mini_batch_updates(plan, train=train, optimizer=optimizer, clip=clip)
        adapters, samples = self.updates.installed.adapter_names, batch.num_samples_in_batch.item()
        self.step_metrics.mini_batch_updates([a for a, _ in plan], adapters, samples)
        return sum(losses, torch.zeros((), device=self.accelerator.device)), norms
