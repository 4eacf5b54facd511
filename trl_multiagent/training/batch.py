"""The one place where model calls become TRL's training tensors."""

from __future__ import annotations

import torch

from ..rollout.records import ModelCall


def calls_to_batch(
    calls: list[ModelCall],
    advantages: list[float],
    episode_ids: list[int],
    pad_token_id: int,
    device: torch.device,
    mask_truncated_completions: bool = False,
) -> dict:
    """Pad the calls into the dict that ``GRPOTrainer._compute_loss`` reads, plus role tags carried along.

    Returns (N = number of calls, P = longest prompt, C = longest completion):
        prompt_ids, prompt_mask: `[N, P]`, left-padded
        completion_ids, completion_mask: `[N, C]`, right-padded; a truncated call's mask is all zero when
            `mask_truncated_completions`
        advantages: `[N]` the episode advantage of each call
        adapter_names, roles: `list[str]` of length N; instances, episode_ids: `[N]`; truncated: `[N]` bool
        sampling_per_token_logps: `[N, C]` when every call carries backend logprobs
    """
    if not calls:
        raise ValueError("The workflow made no model call in this batch: there is nothing to train on.")
    width_p = max(len(c.prompt_ids) for c in calls)
    width_c = max(max(len(c.completion_ids) for c in calls), 1)
    prompt_ids = torch.full((len(calls), width_p), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(calls), width_p), dtype=torch.long)
    completion_ids = torch.full((len(calls), width_c), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((len(calls), width_c), dtype=torch.long)
    for row, call in enumerate(calls):
        p, c = len(call.prompt_ids), len(call.completion_ids)
        prompt_ids[row, width_p - p :] = torch.tensor(call.prompt_ids, dtype=torch.long)
        prompt_mask[row, width_p - p :] = 1
        completion_ids[row, :c] = torch.tensor(call.completion_ids, dtype=torch.long)
        if not (mask_truncated_completions and call.truncated):
            completion_mask[row, :c] = 1
    batch = {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "advantages": torch.tensor(advantages, dtype=torch.float32, device=device),
        "adapter_names": [c.adapter for c in calls],
        "roles": [c.role for c in calls],
        "instances": torch.tensor([c.instance for c in calls], device=device),
        "episode_ids": torch.tensor(episode_ids, device=device),
        "truncated": torch.tensor([c.truncated for c in calls], device=device),
    }
    if all(c.sampling_logprobs is not None for c in calls):
        logps = torch.zeros((len(calls), width_c), dtype=torch.float32)
        for row, call in enumerate(calls):
            logps[row, : len(call.sampling_logprobs)] = torch.tensor(call.sampling_logprobs)
        batch["sampling_per_token_logps"] = logps.to(device)
    return batch
