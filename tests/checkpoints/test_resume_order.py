"""A run resumed from a checkpoint trains the batches an uninterrupted run trains, in the same order, wherever the
checkpoint lies: at an epoch's end, in the middle of the first epoch or of the second; and with ``rollout_ahead=1``,
whose trainer reads each next batch one step early; and on each of several processes.

Six rows, two prompts a step: three steps an epoch, two epochs. The uninterrupted run's order is TRL's own: its
``RepeatSampler``'s first two passes over the rows with the run's seed.
"""

from __future__ import annotations

import pytest
from accelerate.data_loader import prepare_data_loader, skip_first_batches
from scripted import addition_dataset
from tiny import half_right_answers, tiny_trainer
from torch.utils.data import DataLoader
from trl.trainer.utils import RepeatSampler

from trl_multiagent.seams.trl import EpochOrderSampler

ROWS, PROMPTS_PER_STEP, NUM_GENERATIONS, SEED = 6, 2, 4, 3
STEPS_PER_EPOCH = ROWS // PROMPTS_PER_STEP
AHEAD = dict(rollout_backend="vllm", rollout_ahead=1)  # the scripted backend stands in for a vLLM engine


def trainer(tiny_model_dir, output_dir, **settings):
    return tiny_trainer(
        tiny_model_dir,
        output_dir,
        dataset=addition_dataset(ROWS),
        respond=half_right_answers,
        per_device_train_batch_size=PROMPTS_PER_STEP * NUM_GENERATIONS,
        num_generations=NUM_GENERATIONS,
        num_train_epochs=2,
        save_steps=1,
        logging_steps=1,
        learning_rate=1e-2,
        seed=SEED,
        **settings,
    )


def trained_rows(trainer, checkpoint=None) -> list[list[str]]:
    """Train (resumed from ``checkpoint`` if given) and return each step's rows, as its rollouts got them (a row by
    its answer: one for each of its prompt's episodes)."""
    steps, score = [], trainer._generate_and_score

    def recorded(rows):
        steps.append([row["answer"] for row in rows])
        return score(rows)

    trainer._generate_and_score = recorded
    trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
    return steps


def trl_order() -> list[list[str]]:
    """The rows of each step of two epochs, as TRL's sampler orders them in one uninterrupted process."""
    sampler = RepeatSampler(
        addition_dataset(ROWS), mini_repeat_count=NUM_GENERATIONS, batch_size=PROMPTS_PER_STEP, seed=SEED
    )
    indices = list(sampler) + list(sampler)
    batch = PROMPTS_PER_STEP * NUM_GENERATIONS
    answers = addition_dataset(ROWS)["answer"]
    return [[answers[i] for i in indices[k : k + batch]] for k in range(0, len(indices), batch)]


END_OF_FIRST_EPOCH, MID_FIRST_EPOCH, MID_SECOND_EPOCH = STEPS_PER_EPOCH, STEPS_PER_EPOCH - 1, STEPS_PER_EPOCH + 1


@pytest.mark.parametrize(
    "settings, resumed_at",
    [
        ({}, (END_OF_FIRST_EPOCH, MID_FIRST_EPOCH, MID_SECOND_EPOCH)),
        (AHEAD, (END_OF_FIRST_EPOCH, MID_SECOND_EPOCH)),
    ],
    ids=["on_the_spot", "rollout_ahead"],
)
def test_a_resumed_run_trains_the_uninterrupted_order(tiny_model_dir, tmp_path, settings, resumed_at):
    uninterrupted = trained_rows(trainer(tiny_model_dir, tmp_path / "run", **settings))
    assert uninterrupted == trl_order()
    assert uninterrupted[:STEPS_PER_EPOCH] != uninterrupted[STEPS_PER_EPOCH:]  # the second epoch has its own order

    resumed = {}
    for step in resumed_at:
        checkpoint = tmp_path / "run" / f"checkpoint-{step}"
        resumed[step] = trained_rows(trainer(tiny_model_dir, tmp_path / f"from-{step}", **settings), checkpoint)
    assert resumed == {step: uninterrupted[step:] for step in resumed_at}


@pytest.mark.parametrize("rank", [0, 1])
def test_each_of_two_processes_resumes_mid_epoch_on_its_uninterrupted_order(rank):
    """The data loaders alone, as the Trainer prepares one process of two and skips the batches a checkpoint in the
    second epoch trained: there the Trainer's ``set_epoch`` does not reach the sampler, which takes the Trainer's
    epoch count instead."""

    def sampler():
        return RepeatSampler(range(ROWS), mini_repeat_count=NUM_GENERATIONS, batch_size=PROMPTS_PER_STEP, seed=SEED)

    def process_loader(sampler) -> DataLoader:
        loader = DataLoader(range(ROWS), batch_size=PROMPTS_PER_STEP * NUM_GENERATIONS, sampler=sampler)
        return prepare_data_loader(loader, num_processes=2, process_index=rank, put_on_device=False)

    uninterrupted = process_loader(sampler())
    epochs = [[batch.tolist() for batch in uninterrupted] for _ in range(2)]
    assert epochs[0] != epochs[1]

    resumed = skip_first_batches(process_loader(EpochOrderSampler(sampler(), epoch_now=lambda: 1)), 1)
    resumed.set_epoch(1)  # what the Trainer does; accelerate hands it no further than two batch samplers down
    assert [batch.tolist() for batch in resumed] == epochs[1][1:]
