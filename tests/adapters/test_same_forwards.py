"""Under DeepSpeed the forwards of a micro-step must be alike on every process (ZeRO-2 reduces, ZeRO-3 gathers, in
each): `ProcessAlignment.same_forwards` arranges them, with stand-ins that train nothing. Two processes are simulated
by the per-adapter part counts the other one reports."""

from __future__ import annotations

import torch
from peft import get_peft_model
from tiny import tiny_lora
from transformers import AutoModelForCausalLM

from trl_multiagent.adapters.installed import InstalledAdapters
from trl_multiagent.adapters.process_alignment import ProcessAlignment
from trl_multiagent.training.batch import TrainingBatch

ROLE_ADAPTERS = {"generator": "generator", "aggregator": "aggregator"}


def part(adapter: str, n: int) -> TrainingBatch:
    return TrainingBatch(
        prompt_ids=torch.full((n, 3), 5),
        prompt_mask=torch.ones(n, 3, dtype=torch.long),
        completion_ids=torch.full((n, 2), 7),
        completion_mask=torch.ones(n, 2, dtype=torch.long),
        advantages=torch.ones(n),
        roles=[adapter] * n,
        adapters=[adapter] * n,
        instances=torch.zeros(n, dtype=torch.long),
        episode_ids=torch.arange(n),
        truncated=torch.zeros(n, dtype=torch.bool),
        sample_weights=torch.ones(n),
        num_items_in_batch=torch.tensor(2.0 * n),
        num_samples_in_batch=torch.tensor(float(n)),
    )


def alignment(model_dir, most_over_processes=None) -> ProcessAlignment:
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), tiny_lora())
    return ProcessAlignment(InstalledAdapters(model, ROLE_ADAPTERS), most_over_processes=most_over_processes)


def trains_nothing(stand_in: TrainingBatch) -> bool:
    return bool((stand_in.completion_mask == 0).all() and (stand_in.sample_weights == 0).all())


def test_without_deepspeed_the_forwards_are_left_alone(tiny_model_dir):
    parts = [part("aggregator", 2), part("generator", 4)]
    assert alignment(tiny_model_dir).same_forwards(parts, pad_token_id=0) == parts


def test_processes_run_the_same_adapters_in_the_same_order(tiny_model_dir):
    other_process = torch.tensor([3, 1])  # parts per adapter (generator, aggregator) on the other process
    aligned = alignment(tiny_model_dir, most_over_processes=lambda counts: torch.maximum(counts, other_process))
    own = [part("aggregator", 2), part("generator", 4), part("generator", 1)]
    arranged = aligned.same_forwards(own, pad_token_id=0)
    assert [set(p.adapters) for p in arranged] == [{"generator"}] * 3 + [{"aggregator"}]
    assert arranged[:2] == own[1:] and arranged[3] is own[0]  # own parts kept, in their order within an adapter
    assert trains_nothing(arranged[2]) and arranged[2].roles == ["generator"]
