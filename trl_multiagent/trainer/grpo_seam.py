"""``GRPOSeam``: the one place trl-multiagent touches private members of TRL's ``GRPOTrainer`` and of the Trainer.

``MultiAgentGRPOTrainer`` subclasses it. Each private hook of TRL's training loop is overridden here and forwards, with
the same arguments, to a private method of our own (a name TRL does not use) whose default is TRL's own behaviour, so
the trainer overrides our names only and its public methods are TRL's. Each private attribute the trainer reads or
writes is reached through a private method or property of ours here. Nothing else in the package names a private
member of either (tests/trl_compat/test_trl_seam.py checks it), so a TRL release that moves one of them changes this
file alone. On its own, ``GRPOSeam`` trains exactly as ``GRPOTrainer`` does. TRL's helpers below its public surface,
and every other upstream's internals, are in the seams of ``seams/``.

TRL releases: setup.cfg's range (1.14.2 to 1.16); each hook's comment names the TRL (or transformers) release it
follows. Where a release differs in what the seam relies on, the branch on ``TRL_VERSION`` is here, with a comment
naming what that release does.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch
import trl
from accelerate.utils import gather, gather_object, set_seed
from packaging.version import Version
from trl import GRPOConfig, GRPOTrainer

from ..checkpoints import atomic as atomic_checkpoints
from ..seams.accelerate import gradients_unsynced
from ..seams.transformers import rotate_checkpoints
from ..seams.trl import TRL_VERSION, EpochOrderSampler, unwrapped_for_generation


class GRPOSeam(GRPOTrainer):
    """``GRPOTrainer`` with its private hooks and state behind private names of our own (see the module
    docstring)."""

    _tag_names = ["trl", "grpo", "trl-multiagent"]  # Trainer: tags added to the model, its card and its Hub pushes
    _loss_forwards: list | None = None  # the log-prob forwards of TRL's loss, recorded while `_trl_loss` runs
    _generates_itself: bool = False  # a subclass whose rollouts replace TRL's generation sets True (see __init__)

    def __init__(self, model, reward_funcs=None, args: GRPOConfig | None = None, **kwargs):
        if TRL_VERSION < Version("1.15.0"):
            # TRL 1.14 builds the model, and PEFT draws the LoRA weights, before anything seeds (the Trainer seeds
            # later); TRL >= 1.15 calls `set_seed(args.seed)` first. Seeding here gives the adapters `args.seed`
            # decides on every release, as 1.15 does.
            set_seed(args.seed if args is not None else GRPOConfig.seed)
        elif TRL_VERSION < Version("1.16.0"):
            # TRL 1.15 scores completions only through its Triton kernel (`trl.kernels`), which the CPU wheel of
            # torch cannot run (no Triton); 1.16 has a torch path.
            if importlib.util.find_spec("triton") is None:
                raise ImportError(
                    f"TRL {trl.__version__} computes log-probs with a Triton kernel and Triton is not installed (CPU "
                    "builds of torch lack it). Install TRL 1.16 (`pip install 'trl>=1.16,<1.17'`) or 1.14.2, or "
                    "Triton on a GPU machine."
                )
        with _trl_vllm_client_off(args if self._generates_itself else None):
            super().__init__(model, reward_funcs, args, **kwargs)

    # ------------------------------------------------------------------------ hooks of TRL's loop, forwarded
    # Each hook keeps its upstream name and signature here and forwards to a private name of ours, whose default is the
    # upstream's own behaviour: the trainer overrides ours, so TRL's names stay in this file, and a subclass of the
    # trainer sees TRL's public API plus the extension points the trainer documents.

    # TRL GRPOTrainer._generate_and_score_completions (since 0.16; 1.14.2 to 1.16 take the generation batch's rows
    # and return the loss's tensor dict): rolls out one generation batch, scores it, computes advantages.
    def _generate_and_score_completions(self, inputs):
        return self._generate_and_score(inputs)

    def _generate_and_score(self, inputs):
        """A generation batch of dataset rows, rolled out, scored and made into what the loss reads."""
        return super()._generate_and_score_completions(inputs)

    # TRL GRPOTrainer._prepare_inputs (since 0.14; buffered as below since 0.16, unchanged to 1.16): generates every
    # steps_per_generation * num_iterations micro-steps, buffers the split, returns one part.
    def _prepare_inputs(self, generation_batch):
        return self._micro_step_inputs(generation_batch)

    def _micro_step_inputs(self, generation_batch):
        """What one micro-step of the loop (or one evaluation batch) trains on."""
        return super()._prepare_inputs(generation_batch)

    # TRL GRPOTrainer._get_train_sampler (the Trainer's hook, called with the training set; TRL's RepeatSampler, built
    # the same in 1.14.2 to 1.16): the order of the training rows. Wrapped so that each epoch gets the order an
    # uninterrupted run gives it, after a resume too: TRL's own sampler hands the first epoch's order to whichever
    # epoch a resumed run starts in (seams/trl.py, EpochOrderSampler, names the upstream lines). The Trainer's epoch,
    # for a pass no `set_epoch` reached: the whole epochs in its state's count (a resumed run's is its checkpoint's).
    def _get_train_sampler(self, dataset=None):
        return EpochOrderSampler(super()._get_train_sampler(dataset), epoch_now=lambda: int(self.state.epoch))

    # TRL GRPOTrainer._get_per_token_logps_and_entropies (since 0.20; 1.14.2 to 1.16 return (log-probs, entropies,
    # aux loss)): the completions' per-token log-probs (and entropies) in chunks; its loss computes them through here.
    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        output = self._logps_and_entropies(*args, **kwargs)
        if self._loss_forwards is not None:
            self._loss_forwards.append(output)
        return output

    def _logps_and_entropies(self, *args, **kwargs):
        """``(log-probs [N, C], entropies [N, C] or None, aux loss or None)`` of ``model`` on a batch."""
        return super()._get_per_token_logps_and_entropies(*args, **kwargs)

    # Trainer._clip_grad_norm (since transformers 5.3, setup.cfg's floor): clips the gradients before the optimizer
    # step (max_grad_norm > 0) and returns their norm.
    def _clip_grad_norm(self, model):
        return self._clip_gradients(model)

    def _clip_gradients(self, model):
        """Clip before the optimizer step; returns the norm before clipping."""
        return super()._clip_grad_norm(model)

    # Trainer._get_grad_norm (since transformers 5.3): the `grad_norm` it logs: the one clipping returned, or computed
    # here when it does not clip.
    def _get_grad_norm(self, model, grad_norm=None):
        return self._step_grad_norm(model, grad_norm=grad_norm)

    def _step_grad_norm(self, model, grad_norm=None):
        """The gradient norm the step logs (``grad_norm``: the one clipping returned, None without clipping)."""
        return super()._get_grad_norm(model, grad_norm=grad_norm)

    # Trainer._save_checkpoint (transformers 4 and 5, unchanged from 5.3 to 5.25): TRL writes its model card, then the
    # Trainer writes checkpoint-<step>/ (model, optimizer, scheduler, state). Every file goes to a folder aside first,
    # renamed to checkpoint-<step> once complete (checkpoints/atomic.py).
    _saving_aside: bool = False  # while a checkpoint is written: the Trainer's output folder is the staging folder

    def _save_checkpoint(self, model, trial):
        self._saving_aside = False
        run_dir, name = self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}"
        if self.args.should_save:
            atomic_checkpoints.clear_staging(run_dir)
        self.accelerator.wait_for_everyone()
        self._saving_aside = True
        try:
            self._write_checkpoint(model, trial)
        finally:
            self._saving_aside = False
        self.accelerator.wait_for_everyone()  # every process wrote its part (under DeepSpeed: its shards)
        if self.args.should_save:
            staging = atomic_checkpoints.staging_root(run_dir)
            best = self.state.best_model_checkpoint
            if best is not None and best.startswith(staging):  # the Trainer saw the folder aside: the final name
                self.state.best_model_checkpoint = os.path.join(run_dir, os.path.relpath(best, staging))
                self.state.save_to_json(os.path.join(staging, name, "trainer_state.json"))
            atomic_checkpoints.publish(run_dir, name)
            rotate_checkpoints(run_dir, self.args.save_total_limit, self.state.best_model_checkpoint)
        self.accelerator.wait_for_everyone()

    # Trainer._get_output_dir (transformers 4 and 5): the run folder checkpoints go under (a trial's, in a search).
    def _get_output_dir(self, trial):
        run_dir = super()._get_output_dir(trial=trial)
        return atomic_checkpoints.staging_root(run_dir) if self._saving_aside else run_dir

    def _write_checkpoint(self, model, trial) -> None:
        """Write ``_checkpoint_folder(trial)``: model, optimizer, scheduler, trainer state."""
        super()._save_checkpoint(model, trial)

    # Trainer._load_optimizer_and_scheduler (transformers 4 and 5): restores the optimizer and the scheduler from the
    # checkpoint it resumes from.
    def _load_optimizer_and_scheduler(self, checkpoint):
        self._restore_optimizer_and_scheduler(checkpoint)

    def _restore_optimizer_and_scheduler(self, checkpoint) -> None:
        """Restore the optimizer and scheduler from ``checkpoint`` (None: nothing to restore)."""
        super()._load_optimizer_and_scheduler(checkpoint)

    # Trainer._save (transformers 4 and 5): writes the model, its tokenizer and the training arguments (save_model and
    # every checkpoint).
    def _save(self, output_dir=None, state_dict=None):
        self._save_model_files(output_dir, state_dict)

    def _save_model_files(self, output_dir: str | None = None, state_dict=None) -> None:
        """Write the model, its tokenizer and the training arguments to ``output_dir`` (the run's by default)."""
        super()._save(output_dir, state_dict)

    # Trainer._load_from_checkpoint (transformers 4 and 5): loads the model's weights from the checkpoint it resumes
    # from.
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        self._load_model_weights(resume_from_checkpoint, model)

    def _load_model_weights(self, resume_from_checkpoint: str, model=None) -> None:
        """Load the model's weights from a checkpoint folder."""
        super()._load_from_checkpoint(resume_from_checkpoint, model)

    @contextmanager
    def _accumulating(self, model) -> Iterator[None]:
        """Backward passes that add to the gradients of a micro-step without ending it: no gradient sync across
        processes (``no_sync``) and, under DeepSpeed, no engine step (accelerate's backward steps the engine whenever
        its ``sync_gradients`` is set, which the Trainer sets for the whole last micro-step of an accumulation)."""
        with gradients_unsynced(self.accelerator), self.accelerator.no_sync(model):
            yield

    # ------------------------------------------------------------------------------------- TRL's loss
    # TRL GRPOTrainer.compute_loss (public; its log-probs through `_get_per_token_logps_and_entropies`, since 0.20).
    def _trl_loss(self, model, inputs: dict, return_outputs=False, num_items_in_batch=None):
        """TRL's loss on its tensor dict, with the `[N, C]` log-probs and entropies its own forward computed
        (``(loss, per_token_logps, entropies)``)."""
        self._loss_forwards = []
        try:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            per_token_logps, entropies, _ = self._loss_forwards[-1]
        finally:
            self._loss_forwards = None
        return loss, per_token_logps, entropies

    # ---------------------------------------------------------------------------------- TRL's state
    def _leave_entropy_bonus_to_us(self) -> None:
        """TRL's own entropy bonus and adaptive control off (`entropy_coef`, `use_adaptive_entropy` and, since 1.16,
        `_entropy_bonus_enabled`, which its loss reads; its checkpoints then write no `entropy_ctrl_state.json`): the
        trainer adds the bonus per role itself."""
        self.entropy_coef, self.use_adaptive_entropy = 0.0, False
        if hasattr(self, "_entropy_bonus_enabled"):
            self._entropy_bonus_enabled = False

    @property
    def _text_tokenizer(self):
        """TRL's `_tokenizer` (since 1.3): the processing class, or the tokenizer inside a processor."""
        return self._tokenizer

    @property
    def _is_vision_language_model(self) -> bool:
        """TRL's `_is_vlm` (since 1.1): the processing class is a processor (images reach the model)."""
        return self._is_vlm

    @property
    def _micro_step(self) -> int:
        """TRL's `_step` (since 0.16): micro-steps so far (its training_step adds one); it generates at multiples of
        steps_per_generation * num_iterations."""
        return self._step

    @_micro_step.setter
    def _micro_step(self, value: int) -> None:
        self._step = value

    @property
    def _buffered_micro_batches(self) -> list | None:
        """TRL's `_buffered_inputs` (since 0.16): the micro-batches of the current generation batch (None before the
        first and after a resume)."""
        return self._buffered_inputs

    @_buffered_micro_batches.setter
    def _buffered_micro_batches(self, value: list | None) -> None:
        self._buffered_inputs = value

    def _checkpoint_folder(self, trial) -> str:
        """The folder the Trainer writes this step's checkpoint to (`_get_output_dir` / checkpoint-<step>)."""
        return os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")

    def _unwrapped_for_generation(self) -> AbstractContextManager[torch.nn.Module]:
        """The model to generate with, as TRL reaches it (gathered first under ZeRO-3 if asked)."""
        gather_zero3 = self.args.ds3_gather_for_generation
        return unwrapped_for_generation(
            self.model_wrapped,
            self.accelerator,
            gather_deepspeed3_params=gather_zero3,
            gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
        )

    @property
    def _environment_instances(self) -> dict:
        """TRL's `_environment_pool` (since 1.8; `environment_factory`): environment name -> the instances made so
        far, the constructor's probe first; None without environments."""
        return getattr(self, "_environment_pool", None)

    def _score_completions(self, inputs: list[dict], prompts: list, completions: list, completion_ids: list):
        """TRL's `_calculate_rewards` (since 0.19; these four arguments in 1.14.2 to 1.16): every reward function on
        this process's completions (their ``log_extra`` and ``log_metric`` held until `_record_completions`),
        `[E_all, F]` gathered over processes, NaN where a function did not score."""
        return self._calculate_rewards(inputs, prompts, completions, completion_ids)

    def _record_metrics(self, mode: str, values: dict[str, float]) -> None:
        """Append to TRL's `_metrics[mode]` (since 0.14), which its `log` averages over the logging steps."""
        for key, value in values.items():
            self._metrics[mode][key].append(value)

    def _record_completions(self, mode: str, prompts: list, completions: list, rewards_per_func, advantages) -> None:
        """Rows of TRL's completions table (`_logs`, since 0.20; shown with ``log_completions``): this process's
        prompts and completions, gathered here; `[E_all, F]` rewards and `[E_all]` advantages of every process; then
        what the reward functions reported through ``log_extra`` / ``log_metric``, gathered as TRL does."""
        self._logs["prompt"].extend(gather_object(prompts))
        self._logs["completion"].extend(gather_object(completions))
        for i, name in enumerate(self.reward_func_names):
            self._logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
        self._logs["advantages"].extend(advantages.tolist())
        self._flush_reward_function_logs(mode, len(prompts))

    def _record_completion_column(self, column: str, values: list) -> None:
        """An extra column of TRL's completions table from this process's ``values`` (gathered here)."""
        self._logs["extra"][column].extend(gather_object(values))

    def _flush_reward_function_logs(self, mode: str, num_rows: int) -> None:
        # TRL's `_pending_extra_logs` / `_pending_metrics` (since 1.0): what `log_extra` / `log_metric` collected,
        # sorted so every process gathers in the same order; a column a process lacks is None there, a metric the
        # mean of all values.
        for column in sorted(set(gather_object(list(self._pending_extra_logs)))):
            values = self._pending_extra_logs.get(column, [None] * num_rows)
            self._logs["extra"][column].extend(gather_object(values))
        self._pending_extra_logs.clear()
        for name in sorted(set(gather_object(list(self._pending_metrics)))):
            values = self._pending_metrics.get(name, [])
            local = torch.tensor([sum(values), len(values)], dtype=torch.float32, device=self.accelerator.device)
            total, count = gather(local).view(-1, 2).sum(dim=0).tolist()
            self._metrics[mode][name].append(total / count)
        self._pending_metrics.clear()


# TRL GRPOTrainer.__init__ (1.14.2 to 1.16) copies `args.use_vllm` to `self.use_vllm` and, when it is True, starts its
# own vLLM generation (`VLLMGeneration`: a colocated engine, or a client that connects to `trl vllm-serve`); its loop
# reads `self.use_vllm` only after that. A trainer whose rollouts replace TRL's generation (the multi-agent trainer's
# vLLM backend serves every role adapter) keeps that client from starting, while `args.use_vllm` keeps the value the
# user set, for their script and the saved config.
@contextmanager
def _trl_vllm_client_off(args: GRPOConfig | None) -> Iterator[None]:
    """While TRL's ``__init__`` runs, ``args.use_vllm`` reads False; the value set is restored after."""
    if args is None or not args.use_vllm:
        yield
        return
    args.use_vllm = False
    try:
        yield
    finally:
        args.use_vllm = True
