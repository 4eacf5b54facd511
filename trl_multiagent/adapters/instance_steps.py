"""One optimizer step per instance of a parallel role (the reference stack's behaviour under isolated policy).

In the reference stack, a role with k parallel instances (3 voters, 3 workers) updates its adapter once per instance
per training step: k optimizer steps in the same direction, which the research ties to the isolated policy's
gradient amplification. To reproduce it, each instance trains a *shadow* adapter that mirrors the role adapter's
weights: routing sends instance j's samples to shadow j, so after backward shadow j holds exactly instance j's
gradient (gradient checkpointing and mixed batches work unchanged). The optimizer step then applies the shadows'
gradients to the role adapter one after another; other adapters step once, with the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .routing import adapter_parameters, paired_parameters, set_adapters_trainable


def shadow_name(adapter: str, instance: int) -> str:
    return f"{adapter}__instance{instance}"


class InstanceSteps:
    """Shadow adapters of the parallel roles' adapters and the per-instance optimizer step."""

    def __init__(self, peft_model, adapters: Sequence[str], parallel: dict[str, int]):
        """``parallel`` maps each parallel role's adapter to its number of instances per episode."""
        self.model = peft_model
        self.parallel = dict(parallel)
        self.shadows = [shadow_name(a, j) for a, k in self.parallel.items() for j in range(k)]
        # Shadow weights are overwritten right away; forking the RNG keeps their random init from shifting the
        # data order and sampling of the run, so per_instance and merged runs see the same batches.
        with torch.random.fork_rng(devices=[]):
            for adapter, instances in self.parallel.items():
                config = peft_model.peft_config[adapter]
                for j in range(instances):
                    peft_model.add_adapter(shadow_name(adapter, j), config)
        set_adapters_trainable(peft_model, [*adapters, *self.shadows])
        self.sync_weights()

    def training_routing(self, adapters: Sequence[str], instances: Sequence[int]) -> list[str]:
        return [shadow_name(a, int(j)) if a in self.parallel else a for a, j in zip(adapters, instances)]

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Give every shadow the current weights of its role adapter."""
        for adapter, instances in self.parallel.items():
            for j in range(instances):
                for param, shadow in paired_parameters(self.model, adapter, shadow_name(adapter, j)):
                    shadow.copy_(param)

    def summed_gradients(self, adapter: str) -> list[torch.Tensor]:
        """The sum of a parallel adapter's shadow gradients: what one merged step would apply."""
        shadows = [shadow_name(adapter, j) for j in range(self.parallel[adapter])]
        pairs = [list(paired_parameters(self.model, adapter, s)) for s in shadows]
        return [
            sum(pair[i][1].grad for pair in pairs)
            for i in range(len(pairs[0]))
            if all(pair[i][1].grad is not None for pair in pairs)
        ]

    def step(self, optimizer_step: Callable[[], None], other_params: Sequence[torch.nn.Parameter]) -> None:
        """k optimizer steps for each parallel adapter (instance j's gradient at step j), one for the others."""
        rounds = max(self.parallel.values())
        kept = [(p, p.grad) for p in other_params]
        for j in range(rounds):
            for adapter, instances in self.parallel.items():
                if j >= instances:
                    for param in adapter_parameters(self.model, adapter).values():
                        param.grad = None
                    continue
                for param, shadow in paired_parameters(self.model, adapter, shadow_name(adapter, j)):
                    param.grad = None if shadow.grad is None else shadow.grad.clone()
            for param, grad in kept:  # the other adapters take their single step with the first round
                param.grad = grad if j == 0 else None
            optimizer_step()
        self.sync_weights()
