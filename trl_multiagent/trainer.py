"""``MultiAgentGRPOTrainer``: GRPO over whole-workflow episodes, every role trained from one outcome reward.

One training step, in order (mirrored by the numbered comments below):
    1. run `num_generations` episodes of the workflow per prompt through the rollout engine;
    2. score each episode's final answer with `reward_funcs` and turn the rewards into GRPO advantages over the
       episodes of each prompt (across processes);
    3. broadcast each episode's advantage to every model call it made, one training sample per call;
    4. split the samples into `steps_per_generation` micro-batches without dropping any, with exact per-sample
       weights (role weights, role balance, uneven micro-batches);
    5. TRL's loss on each micro-batch, every sample routed to its role's adapter, plus the per-role KL term.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections import defaultdict
from contextlib import contextmanager

import torch
from accelerate.utils import gather, gather_object
from trl import GRPOTrainer
from trl.data_utils import is_conversational
from trl.models import unwrap_model_for_generation
from trl.models.utils import disable_gradient_checkpointing
from trl.trainer.utils import shuffle_sequence_dict

from .adapters.coherence import CoherenceDamping
from .adapters.instance_steps import InstanceSteps, shadow_name
from .adapters.role_gradients import RoleGradientSplit
from .adapters.routing import (
    BASE_MODEL,
    AdapterRouter,
    adapter_parameters,
    install_role_adapters,
    resolve_role_adapters,
    set_adapters_trainable,
    unique_adapters,
)
from .checkpoints.card import final_metrics, model_card_section
from .config import MultiAgentGRPOConfig
from .monitoring import DriftThresholds, RoleDriftCallback, TrainingSummaryCallback, workflow_metrics
from .rollout.backends.base import GenerationRequest, GenerationResult
from .rollout.backends.transformers_backend import TransformersBackend
from .rollout.backends.vllm_backend import VLLMBackend, VLLMServerBackend
from .rollout.engine import RolloutEngine
from .toy import model_name
from .training.advantages import group_advantages
from .training.batch import calls_to_batch
from .training.loss_weights import aggregate_like_trl, chunk_correction, role_weights, split_sizes
from .workflows.base import Workflow


class _ProbeBackend:
    """Answers every call with an empty output: walks a workflow's control flow to check its roles."""

    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        return [GenerationResult(prompt_ids=[], completion_ids=[], text="", truncated=False) for _ in requests]


class MultiAgentGRPOTrainer(GRPOTrainer):
    """GRPO for multi-agent workflows. Takes every argument of [`~trl.GRPOTrainer`] plus `workflow`.

    Args:
        workflow ([`Workflow`]): the roles and how they talk; each `generate` call is one training sample.
        peft_config (`peft.LoraConfig`): the configuration of every role adapter (required: roles are adapters).
        rollout_backend: an object with `generate(requests) -> results` to use instead of the one named by
            `args.rollout_backend` (tests pass scripted backends here).
        answer_checker: `(text, answer) -> bool`, with the dataset's `answer` column, regrades every answering role's
            own outputs (`workflow/regraded/<role>`, pass@N over voters or workers, verdict accuracy).
    """

    _tag_names = ["trl", "grpo", "trl-multiagent"]

    def __init__(
        self,
        model,
        workflow: Workflow,
        reward_funcs,
        args: MultiAgentGRPOConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        callbacks=None,
        optimizers=(None, None),
        peft_config=None,
        rollout_backend=None,
        answer_checker=None,
    ):
        if args is None:
            args = MultiAgentGRPOConfig(output_dir="trl-multiagent-output")
        if not isinstance(args, MultiAgentGRPOConfig):
            raise TypeError(f"`args` must be a MultiAgentGRPOConfig, got {type(args).__name__}.")
        if not isinstance(workflow, Workflow) or not workflow.roles:
            raise TypeError("`workflow` must be a trl_multiagent Workflow subclass instance with non-empty `roles`.")
        if peft_config is None:
            raise ValueError("Pass a LoRA `peft_config`: every role is trained as a LoRA adapter on a frozen base.")
        _check_prompt_column(train_dataset, "train_dataset")
        self.workflow = workflow
        self.role_adapters = resolve_role_adapters(workflow.roles, args.policy_sharing, args.role_to_adapter)
        for name in ("role_loss_weights", "role_beta", "role_coherence_lambda"):
            unknown = sorted(set(getattr(args, name) or {}) - set(workflow.roles))
            if unknown:
                raise ValueError(f"`{name}` names role(s) {unknown}; the workflow's roles are {list(workflow.roles)}.")

        super().__init__(
            model=model,
            reward_funcs=reward_funcs,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
        )

        self.adapter_names = unique_adapters(self.role_adapters)
        install_role_adapters(self.model, self.adapter_names)
        self.router = AdapterRouter(self.model)
        # The KL term is computed here, per role, against the base model reached by routing samples to no adapter;
        # TRL's own reference pass (disable_adapter) would leave non-active adapters frozen.
        self.role_beta = {role: float((args.role_beta or {}).get(role, args.beta)) for role in workflow.roles}
        self.beta = 0.0
        self.role_loss_weights = dict(args.role_loss_weights or {})
        self.rollout_backend = rollout_backend or self._default_backend()
        # TRL's loss multiplies by `importance_sampling_ratio` only under `use_vllm` (our config keeps TRL's own vLLM
        # generation off); vLLM rollouts set the ratio in `_generate_and_score_completions`.
        self.use_vllm = isinstance(self.rollout_backend, VLLMBackend | VLLMServerBackend)
        self._synced_step = -1
        self.engine = RolloutEngine(workflow, self.rollout_backend, self.role_adapters)
        self.answer_checker = answer_checker
        if args.drift_alarms:
            # First in line, so the report_to integrations that log after it see the alarm metrics.
            thresholds = DriftThresholds(**(args.drift_thresholds or {}))
            drift = RoleDriftCallback(thresholds, stop_on_alarm=args.stop_on_drift)
            self.callback_handler.callbacks.insert(0, drift)
        if args.training_summary:
            self.add_callback(TrainingSummaryCallback())
        probe = self._check_workflow_roles(train_dataset)
        self.instance_steps = self._setup_instance_steps(probe) if args.parallel_role_steps == "per_instance" else None
        self.role_split = None
        if args.monitor_role_grad_norms and len(set(self.role_adapters.values())) < len(self.role_adapters):
            trainable = [*self.adapter_names, *(self.instance_steps.shadows if self.instance_steps else [])]
            self.role_split = RoleGradientSplit(self.model, self.role_adapters, trainable)
        self.coherence = self._setup_coherence_damping(args)
        self._captured_logps = None
        self._samples_trained = 0

    # ----------------------------------------------------------------------------------------------- setup helpers
    def _default_backend(self):
        if self.args.rollout_backend == "vllm":
            return self._vllm_backend()
        return TransformersBackend(
            unwrapped_model=self._unwrapped_for_generation,
            tokenizer=self._tokenizer,
            router=self.router,
            generation_config=self.generation_config,
            eos_token_ids=self.eos_token_ids,
            chat_template_kwargs=self.chat_template_kwargs,
            max_batch_size=self.args.rollout_batch_size,
        )

    def _vllm_backend(self):
        args, lora = self.args, self.model.peft_config[self.adapter_names[0]]
        sampling = dict(
            max_tokens=self.max_completion_length,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p or 0.0,
            repetition_penalty=self.repetition_penalty,
            **(args.generation_kwargs or {}),
        )
        common = dict(
            tokenizer=self._tokenizer,
            adapter_names=self.adapter_names,
            sampling=sampling,
            eos_token_ids=self.eos_token_ids,
            chat_template_kwargs=self.chat_template_kwargs,
        )
        if args.vllm_mode == "server":
            url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
            return VLLMServerBackend(url, timeout=args.vllm_server_timeout, **common)
        return VLLMBackend(
            model=lora.base_model_name_or_path,
            lora_rank=max([lora.r, *lora.rank_pattern.values()]),
            dtype=str(self.model.dtype).removeprefix("torch."),  # serve the weights the trainer's log-probs use
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            max_model_len=args.vllm_max_model_length,
            max_num_seqs=args.rollout_batch_size,
            seed=args.seed + self.accelerator.process_index,  # processes sample different episodes
            distributed_executor_backend="external_launcher" if self.accelerator.num_processes > 1 else "uni",
            **common,
        )

    def _sync_vllm_adapters(self) -> None:
        """Send the adapters as they are after the last optimizer step to vLLM (gathered first under ZeRO-3)."""
        with self._unwrapped_for_generation() as model:
            # A shared server takes the adapters from one process; colocated engines each need their own copy.
            if self.args.vllm_mode == "colocate" or self.accelerator.is_main_process:
                self.rollout_backend.sync_adapters(model, self.adapter_names)
        self.accelerator.wait_for_everyone()
        self._synced_step = self.state.global_step

    @contextmanager
    def _unwrapped_for_generation(self):
        with unwrap_model_for_generation(
            self.model_wrapped, self.accelerator, gather_deepspeed3_params=self.args.ds3_gather_for_generation
        ) as model:
            yield model

    def _check_workflow_roles(self, dataset):
        """Walk the workflow once on the first prompt with empty outputs, so an undeclared role fails now."""
        if dataset is None or len(dataset) == 0:
            return None
        return RolloutEngine(self.workflow, _ProbeBackend(), self.role_adapters).run([dataset[0]["prompt"]])[0]

    def _setup_instance_steps(self, probe) -> InstanceSteps | None:
        if probe is None:
            raise ValueError("`parallel_role_steps='per_instance'` needs a train_dataset to find the parallel roles.")
        instances = defaultdict(int)
        for call in probe.calls:
            instances[call.role] = max(instances[call.role], call.instance + 1)
        parallel = {}
        for role, count in instances.items():
            if count < 2:
                continue
            adapter = self.role_adapters[role]
            sharing = [r for r, a in self.role_adapters.items() if a == adapter and r != role]
            if sharing:
                raise ValueError(
                    f"`parallel_role_steps='per_instance'` steps role {role!r}'s adapter once per instance, but "
                    f"{adapter!r} also serves {sharing}. Use policy_sharing='isolated' (or a mapping that gives "
                    f"{role!r} its own adapter), or parallel_role_steps='merged'."
                )
            parallel[adapter] = count
        return InstanceSteps(self.model, self.adapter_names, parallel) if parallel else None

    def _setup_coherence_damping(self, args) -> CoherenceDamping | None:
        if not args.role_coherence_lambda:
            return None
        if self.is_deepspeed_enabled:
            raise ValueError("`role_coherence_lambda` needs gradients in `.grad`; DeepSpeed partitions them away.")
        lambdas: dict[str, float] = {}
        for role, value in args.role_coherence_lambda.items():
            adapter = self.role_adapters[role]
            if lambdas.setdefault(adapter, float(value)) != float(value):
                raise ValueError(f"Roles sharing adapter {adapter!r} were given different coherence lambdas.")
            if self.instance_steps is not None and adapter in self.instance_steps.parallel:
                raise ValueError(
                    f"Coherence damping of {role!r} with parallel_role_steps='per_instance' is not supported; use "
                    "parallel_role_steps='merged' for that role."
                )
        return CoherenceDamping(lambdas, dict.fromkeys(lambdas, args.role_coherence_window))

    def _damp_coherent_gradients(self) -> None:
        if self.coherence is None:
            return
        for adapter in self.coherence.lambdas:
            grads = [p.grad for p in adapter_parameters(self.model, adapter).values() if p.grad is not None]
            if not grads:
                continue
            cosine, scale = self.coherence.apply(adapter, grads)
            self._metrics["train"][f"adapter/{adapter}/coherence_cos"].append(cosine)
            self._metrics["train"][f"adapter/{adapter}/coherence_scale"].append(scale)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.coherence is not None and self.args.should_save:
            folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
            torch.save(self.coherence.state_dict(), os.path.join(folder, "coherence_state.pt"))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, "coherence_state.pt") if checkpoint else None
        if self.coherence is not None and path and os.path.isfile(path):
            self.coherence.load_state_dict(torch.load(path))

    def _shadow_adapters(self) -> list[str]:
        shadows = list(self.instance_steps.shadows) if self.instance_steps is not None else []
        return shadows + (self.role_split.shadows if self.role_split is not None else [])

    def create_optimizer(self, model=None):
        if not self._shadow_adapters():
            return super().create_optimizer(model)
        # Shadows only carry gradients (per instance, or per role for monitoring); they are never optimised.
        shadows = [p for s in self._shadow_adapters() for p in adapter_parameters(self.model, s).values()]
        for param in shadows:
            param.requires_grad = False
        try:
            optimizer = super().create_optimizer(model)
        finally:
            for param in shadows:
                param.requires_grad = True
        single_step = optimizer.step
        if self.instance_steps is not None:
            parallel = set(self.instance_steps.parallel)
            others = [
                p for a in self.adapter_names if a not in parallel for p in adapter_parameters(self.model, a).values()
            ]

            def step(closure=None):
                self.instance_steps.step(lambda: single_step(closure), others)
                self._after_optimizer_step()
        else:

            def step(closure=None):
                single_step(closure)
                self._after_optimizer_step()

        optimizer.step = step
        return optimizer

    def _after_optimizer_step(self) -> None:
        if self.role_split is not None:
            self.role_split.sync_weights()

    # --------------------------------------------------------------------------------------------------- rollouts
    def _generate_and_score_completions(self, inputs: list[dict]) -> dict:
        device = self.accelerator.device
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        prompts = [row["prompt"] for row in inputs]

        # 1. Episodes: every model call of every episode, batched per tick across episodes.
        if self.use_vllm and self._synced_step != self.state.global_step:
            self._sync_vllm_adapters()
        episodes = self.engine.run(prompts)

        # 2. Outcome rewards on the final answers, advantages grouped over the episodes of each prompt.
        completions = [
            [{"role": "assistant", "content": e.final_answer}] if is_conversational(row) else e.final_answer
            for e, row in zip(episodes, inputs)
        ]
        last_ids = [e.calls[-1].completion_ids if e.calls else [] for e in episodes]
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, last_ids)  # [E_all, F], gathered
        unscorable = torch.isnan(rewards_per_func).all(dim=1)
        rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        rewards[unscorable] = torch.nan
        all_advantages = group_advantages(rewards, num_generations, self.scale_rewards)
        start = self.accelerator.process_index * len(prompts)
        episode_advantages = all_advantages[start : start + len(prompts)].tolist()

        # 3. One training sample per model call, carrying its episode's advantage.
        calls, advantages, episode_ids = [], [], []
        for episode, advantage in zip(episodes, episode_advantages):
            calls += episode.calls
            advantages += [advantage] * len(episode.calls)
            episode_ids += [start + episode.index] * len(episode.calls)
        batch = calls_to_batch(
            calls, advantages, episode_ids, self._tokenizer.pad_token_id, device, self.args.mask_truncated_completions
        )
        token_counts = batch["completion_mask"].sum(dim=1)
        batch["sample_weights"] = role_weights(
            batch["roles"], token_counts, self.role_loss_weights, self.args.role_loss_balance, self.loss_type
        )
        totals = gather(torch.tensor([len(calls), token_counts.sum().item()], device=device).view(1, 2)).sum(dim=0)
        batch["num_items_in_batch"] = totals[1].float()
        batch["num_samples_in_batch"] = totals[0].float()
        self._log_rollout_metrics(mode, episodes, batch, rewards, rewards_per_func, all_advantages, prompts)
        self._log_workflow_metrics(mode, episodes, inputs, rewards[start : start + len(prompts)].tolist())

        # Log-probabilities that the loss needs from before the update, each sample through its own adapter.
        generate_every = self.args.steps_per_generation * self.num_iterations
        correct_sampling = self.use_vllm and self.vllm_importance_sampling_correction
        with torch.no_grad(), disable_gradient_checkpointing(self.model, self.args.gradient_checkpointing_kwargs):
            if self.args.gradient_accumulation_steps % generate_every != 0 or correct_sampling:
                batch["old_per_token_logps"] = self._routed_logps(batch, batch["adapter_names"], mode)
            if self.args.monitor_kl_to_base or any(self.role_beta[r] for r in set(batch["roles"])):
                batch["ref_per_token_logps"] = self._routed_logps(batch, [BASE_MODEL] * len(calls), mode)
        if correct_sampling:
            batch["importance_sampling_ratio"] = importance_sampling_ratio(
                batch["old_per_token_logps"],
                batch["sampling_per_token_logps"],
                batch["completion_mask"],
                self.vllm_importance_sampling_mode,
                self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max,
            )
        return batch

    def _routed_logps(self, batch: dict, adapters: list[str], mode: str) -> torch.Tensor:
        input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
        attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
        logits_to_keep = batch["completion_ids"].size(1)
        size = self.args.per_device_train_batch_size if mode == "train" else self.args.per_device_eval_batch_size
        chunks = []
        for begin in range(0, input_ids.size(0), size):
            rows = slice(begin, begin + size)
            with self.router.route(adapters[rows]):
                logps, _, _ = self._get_per_token_logps_and_entropies(
                    self.model, input_ids[rows], attention_mask[rows], logits_to_keep
                )
            chunks.append(logps)
        return torch.cat(chunks, dim=0)

    def _prepare_inputs(self, generation_batch):
        # TRL's version splits with a fixed chunk size and drops the remainder; workflows make a variable number of
        # calls, so split into near-equal micro-batches and weigh each sample exactly (loss_weights.py).
        mode = "train" if self.model.training else "eval"
        if mode == "eval":
            batch = self._generate_and_score_completions(generation_batch)
            batch["advantages"] = batch["advantages"] * batch["sample_weights"]
            return batch
        steps = self.args.steps_per_generation
        if self._step % (steps * self.num_iterations) == 0 or self._buffered_inputs is None:
            batch = shuffle_sequence_dict(self._generate_and_score_completions(generation_batch))
            self._buffered_inputs = self._split_weighted(batch, steps)
        return self._buffered_inputs[self._step % steps]

    def _split_weighted(self, batch: dict, steps: int) -> list[dict]:
        size = len(batch["roles"])
        token_counts = batch["completion_mask"].sum(dim=1).float()
        chunks, begin = [], 0
        for chunk_size in split_sizes(size, steps):
            rows = slice(begin, begin + chunk_size)
            begin += chunk_size
            chunk = {
                k: (v[rows] if (isinstance(v, list) or (torch.is_tensor(v) and v.dim() > 0)) else v)
                for k, v in batch.items()
            }
            correction = chunk_correction(
                self.loss_type,
                chunk_size,
                token_counts[rows].sum().item(),
                int(batch["num_samples_in_batch"].item()),
                batch["num_items_in_batch"].item(),
                self.accelerator.num_processes,
                steps,
            )
            chunk["sample_weights"] = chunk["sample_weights"] * correction
            chunk["advantages"] = chunk["advantages"] * chunk["sample_weights"]
            chunks.append(chunk)
        return chunks

    # ------------------------------------------------------------------------------------------------------- loss
    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        output = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if torch.is_grad_enabled():  # the loss forward: keep its log-probs for the per-role KL term and metrics
            self._captured_logps = output
        return output

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # 5. Route every sample to its adapter; the routing stays set through backward, so checkpointed layers
        # recompute with the same adapters.
        routing = inputs["adapter_names"]
        if self.instance_steps is not None and self.model.training:
            routing = self.instance_steps.training_routing(routing, inputs["instances"].tolist())
        if self.role_split is not None and self.model.training:
            routing = self.role_split.routing(routing, inputs["roles"])
        self.router.set(routing)
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        per_token_logps, entropies, _ = self._captured_logps
        self._captured_logps = None
        if "ref_per_token_logps" in inputs:
            loss = loss + self._kl_loss(per_token_logps, inputs)
        self._log_role_loss_metrics(per_token_logps.detach(), entropies.detach(), inputs)
        if self.model.training:
            self._count_trained(len(inputs["roles"]))
        return loss

    def _kl_loss(self, per_token_logps: torch.Tensor, inputs: dict) -> torch.Tensor:
        ref = inputs["ref_per_token_logps"]
        per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        beta = torch.tensor([self.role_beta[r] for r in inputs["roles"]], device=per_token_kl.device)
        scale = (beta * inputs["sample_weights"]).unsqueeze(1)
        mask = inputs["completion_mask"]
        mode = "train" if self.model.training else "eval"
        for role in sorted(set(inputs["roles"])):
            rows = torch.tensor([r == role for r in inputs["roles"]], device=mask.device)
            kl = (per_token_kl[rows] * mask[rows]).sum() / mask[rows].sum().clamp(min=1)
            self._metrics[mode][f"role/{role}/kl"].append(kl.item())
        return aggregate_like_trl(
            per_token_kl * scale,
            mask,
            self.loss_type,
            self.current_gradient_accumulation_steps,
            self.max_completion_length,
            inputs.get("num_items_in_batch"),
            self.accelerator.num_processes,
            self.args.steps_per_generation,
            training=self.model.training,
        )

    def _log_role_loss_metrics(self, logps: torch.Tensor, entropies: torch.Tensor, inputs: dict) -> None:
        """Per-role entropy, perplexity of the sampled tokens, and drift between training and rollout policies.

        The rollout policy is the backend's sampling log-probs when it reports them, else the log-probs from before
        this generation's updates; with neither (one update per generation), the ratio is exactly 1.
        """
        mask = inputs["completion_mask"].float()
        rollout = inputs.get("sampling_per_token_logps", inputs.get("old_per_token_logps"))
        ratio = torch.exp(logps - rollout) if rollout is not None else torch.ones_like(logps)
        clipped = (ratio < 1 - self.epsilon_low) | (ratio > 1 + self.epsilon_high)
        per_token = torch.stack([entropies, -logps, ratio, (ratio - 1) ** 2, clipped.float(), torch.ones_like(logps)])
        rows = torch.stack([torch.tensor([r == role for r in inputs["roles"]]) for role in self.workflow.roles])
        rows = rows.to(mask.device).float()  # [R, N]
        sums = torch.einsum("rn,knt,nt->rk", rows, per_token, mask)  # [R, 6]: masked token sums per role
        sums = self.accelerator.reduce(sums, reduction="sum")
        metrics = self._metrics["train" if self.model.training else "eval"]
        for role, (entropy, nll, ratio_sum, chi, clip, tokens) in zip(self.workflow.roles, sums.tolist()):
            if tokens:
                metrics[f"role/{role}/entropy"].append(entropy / tokens)
                metrics[f"role/{role}/perplexity"].append(float(torch.exp(torch.tensor(nll / tokens))))
                metrics[f"role/{role}/policy_ratio"].append(ratio_sum / tokens)
                metrics[f"role/{role}/chi_square"].append(chi / tokens)
                metrics[f"role/{role}/clip_fraction"].append(clip / tokens)

    def _clip_grad_norm(self, model):
        self._before_optimizer_step()
        return super()._clip_grad_norm(model)

    def _get_grad_norm(self, model, grad_norm=None):
        if grad_norm is None:  # no clipping this run: the same preparation happens here instead
            self._before_optimizer_step()
        return super()._get_grad_norm(model, grad_norm=grad_norm)

    def _before_optimizer_step(self) -> None:
        role_squares = {}
        if self.role_split is not None:
            role_squares = self.role_split.role_squares()
            self.role_split.merge()
        self._log_adapter_grad_norms(role_squares)
        self._damp_coherent_gradients()

    def _log_adapter_grad_norms(self, role_squares: dict[str, float]) -> None:
        """Pre-clipping gradient norm of each adapter and its share of the step's squared total.

        An adapter that serves one role carries exactly that role's contribution, logged as `role/<role>/grad_norm`;
        roles sharing an adapter are measured through `role_squares` (`monitor_role_grad_norms`), their share being
        relative to the squared norms of all role contributions. (Under DeepSpeed the gradients are partitioned
        away from `.grad`: not measured.)
        """
        if self.is_deepspeed_enabled:
            return
        squares = {}
        for adapter in self.adapter_names:
            grads = [p.grad for p in adapter_parameters(self.model, adapter).values() if p.grad is not None]
            if self.instance_steps is not None and adapter in self.instance_steps.parallel:
                # The role's gradient is spread over its shadows: their sum is what a merged step would apply.
                shadows = [shadow_name(adapter, j) for j in range(self.instance_steps.parallel[adapter])]
                per_shadow = [adapter_parameters(self.model, s) for s in shadows]
                grads = [
                    sum(p[n.replace(f".{adapter}.", f".{s}.")].grad for p, s in zip(per_shadow, shadows))
                    for n in adapter_parameters(self.model, adapter)
                    if all(
                        p[n.replace(f".{adapter}.", f".{s}.")].grad is not None for p, s in zip(per_shadow, shadows)
                    )
                ]
            squares[adapter] = float(sum(g.float().pow(2).sum() for g in grads)) if grads else 0.0
        total = sum(squares.values())
        metrics = self._metrics["train"]
        for adapter, square in squares.items():
            metrics[f"adapter/{adapter}/grad_norm"].append(square**0.5)
            metrics[f"adapter/{adapter}/grad_norm_share"].append(square / total if total else 0.0)
            roles = [r for r, a in self.role_adapters.items() if a == adapter]
            if len(roles) == 1:
                role_squares = {**role_squares, roles[0]: square}
        role_total = sum(role_squares.values())
        for role, square in role_squares.items():
            metrics[f"role/{role}/grad_norm"].append(square**0.5)
            metrics[f"role/{role}/grad_norm_share"].append(square / role_total if role_total else 0.0)

    def _count_trained(self, count: int) -> None:
        self._samples_trained += count
        if (self._step + 1) % self.args.steps_per_generation == 0:  # last micro-batch of this generation
            total = gather(torch.tensor([self._samples_trained], device=self.accelerator.device)).sum().item()
            self._metrics["train"]["workflow/samples_trained"].append(float(total))
            self._samples_trained = 0

    # ------------------------------------------------------------------------------------------------------ saving
    def _save(self, output_dir: str | None = None, state_dict=None):
        # Each role adapter lands in its own sub-folder (PEFT's layout for named adapters); next to them, what it
        # takes to rebuild the workflow that trained them.
        super()._save(output_dir, state_dict)
        output_dir = output_dir or self.args.output_dir
        if self.args.should_save:
            for shadow in self._shadow_adapters():
                shutil.rmtree(os.path.join(output_dir, shadow), ignore_errors=True)
            with open(os.path.join(output_dir, "multiagent_config.json"), "w") as f:
                json.dump(self.multiagent_config(), f, indent=2)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        # Trainer's PEFT resume reloads only the active adapter from the checkpoint root (and leaves the others
        # frozen); role adapters live in one sub-folder each.
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        model = self.accelerator.unwrap_model(model or self.model)
        for adapter in self.adapter_names:
            path = os.path.join(resume_from_checkpoint, adapter, "adapter_model.safetensors")
            if not os.path.isfile(path):
                raise FileNotFoundError(
                    f"{resume_from_checkpoint} has no weights for adapter {adapter!r} (expected {path}). Resume with "
                    "the same workflow and policy sharing as the run that wrote the checkpoint."
                )
            set_peft_model_state_dict(model, load_file(path), adapter_name=adapter)
        set_adapters_trainable(model, [*self.adapter_names, *self._shadow_adapters()])
        if self.instance_steps is not None:
            self.instance_steps.sync_weights()
        if self.role_split is not None:
            self.role_split.sync_weights()

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        if not self.is_world_process_zero():
            return
        metrics = final_metrics(self.state.log_history)
        section = model_card_section(self.multiagent_config(), metrics, self.hub_model_id)
        with open(os.path.join(self.args.output_dir, "README.md"), "a") as f:
            f.write(section)

    def multiagent_config(self) -> dict:
        return {
            "base_model": model_name(self.model.peft_config[self.adapter_names[0]].base_model_name_or_path),
            "workflow": self.workflow.config_dict(),
            "policy_sharing": self.args.policy_sharing,
            "role_to_adapter": self.role_adapters,
            "adapters": self.adapter_names,
        }

    # ---------------------------------------------------------------------------------------------------- metrics
    def _log_workflow_metrics(self, mode: str, episodes, inputs: list[dict], rewards: list[float]) -> None:
        checker = self.answer_checker if self.answer_checker and "answer" in inputs[0] else None
        answers = [row["answer"] for row in inputs] if checker else None
        values = workflow_metrics(self.workflow, episodes, rewards, checker, answers)
        values.pop("workflow/success", None)  # logged from the rewards of every process already
        for key, value in values.items():
            self._metrics[mode][key].append(value)
        # Each role's outputs of every episode, as extra columns of TRL's completions table (log_completions).
        for role in self.workflow.roles:
            column = ["\n---\n".join(c.text for c in e.calls if c.role == role) for e in episodes]
            self._logs["extra"][f"role/{role}"].extend(gather_object(column))

    def _log_rollout_metrics(self, mode, episodes, batch, rewards, rewards_per_func, all_advantages, prompts):
        metrics = self._metrics[mode]
        device = self.accelerator.device
        metrics["workflow/samples_generated"].append(batch["num_samples_in_batch"].item())
        calls_per_episode = gather(torch.tensor([float(len(e.calls)) for e in episodes], device=device))
        metrics["workflow/calls_per_episode"].append(calls_per_episode.mean().item())
        metrics["workflow/success"].append(torch.nanmean(rewards).item())
        metrics["reward"].append(torch.nanmean(rewards).item())
        metrics["reward_std"].append(torch.nan_to_num(rewards.view(-1, 1).std(), nan=0.0).item())
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(rewards_per_func[:, i]).item())
        tokens = batch["completion_mask"].sum(dim=1)
        per_role = defaultdict(list)
        for i, role in enumerate(batch["roles"]):
            per_role[role].append(i)
        for role in self.workflow.roles:  # every process reports every role, so the gathers line up
            rows = per_role.get(role, [])
            stats = torch.tensor(
                [
                    float(len(rows)),
                    float(tokens[rows].sum()) if rows else 0.0,
                    float(batch["truncated"][rows].sum()) if rows else 0.0,
                    float(batch["advantages"][rows].sum()) if rows else 0.0,
                ],
                device=device,
            )
            n, token_sum, truncated, advantage_sum = gather(stats.view(1, -1)).sum(dim=0).tolist()
            metrics[f"role/{role}/calls"].append(n)
            if n:
                metrics[f"role/{role}/completion_length"].append(token_sum / n)
                metrics[f"role/{role}/truncated_fraction"].append(truncated / n)
                metrics[f"role/{role}/advantage"].append(advantage_sum / n)
        self.state.num_input_tokens_seen += int(
            gather((batch["prompt_mask"].sum() + batch["completion_mask"].sum()).view(1)).sum().item()
        )
        self._logs["prompt"].extend(gather_object(prompts))
        self._logs["completion"].extend(gather_object([e.final_answer for e in episodes]))
        for i, name in enumerate(self.reward_func_names):
            self._logs["rewards"][name].extend(rewards_per_func[:, i].tolist())
        self._logs["advantages"].extend(all_advantages.tolist())


def importance_sampling_ratio(old_logps, sampling_logps, mask, mode: str, clip_min, clip_max) -> torch.Tensor:
    """TRL's correction for the gap between the rollout engine's sampling policy and the trained one.

    Returns `[N, C]` for token modes, `[N, 1]` for sequence modes; "truncate" clamps to [clip_min, clip_max], "mask"
    zeroes the ratios outside. A NaN sampling log-prob counts as no gap, as in TRL.
    """
    diff = torch.nan_to_num((old_logps - sampling_logps) * mask, nan=0.0)
    if mode.startswith("sequence"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode.endswith("truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -math.inf
    high = clip_max if clip_max is not None else math.inf
    return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)


def _check_prompt_column(dataset, name: str) -> None:
    if dataset is None:
        return
    columns = getattr(dataset, "column_names", None)
    if columns is not None and "prompt" not in columns:
        raise ValueError(
            f"`{name}` has no `prompt` column (columns: {columns}). Each row needs a conversational `prompt`: "
            'a list of messages such as [{"role": "user", "content": "..."}].'
        )
