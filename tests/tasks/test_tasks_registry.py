"""One task registry read by recipes, CLI, evaluation and prompts; one grader of role correctness; one success."""

from __future__ import annotations

import pytest

from trl_multiagent.cli.commands import train_command
from trl_multiagent.evaluation import EvalSettings
from trl_multiagent.evaluation.toy import held_out_dataset, role_quality
from trl_multiagent.monitoring import workflow_metrics
from trl_multiagent.rollout.records import Episode, ModelCall
from trl_multiagent.tasks import TASKS, get_task
from trl_multiagent.tasks.registry import GENERATED_TRAIN_SIZE
from trl_multiagent.training.role_rewards import builtin_role_rewards
from trl_multiagent.workflows import PROMPT_SETS, EvalOpt, OrchWorkers, SingleAgent, Voting
from trl_multiagent.workflows.correctness import grade_calls, solved
from trl_multiagent.workflows.formats import BoxedAnswer, CodeAnswer


def call(role: str, text: str, instance: int = 0) -> ModelCall:
    return ModelCall(role, instance, role, [], [1], [2], text, truncated=False)


def boxed(answer: str) -> str:
    return f"\\boxed{{{answer}}}"


def right_if_boxed_4(episode: Episode) -> dict[int, bool]:
    """Answer call index -> is it right (the problem's answer is 4)."""
    return {
        i: c.text == boxed("4")
        for i, c in enumerate(episode.calls)
        if c.role in ("generator", "worker", "synthesizer")
    }


# ---------------------------------------------------------------------------------------------------- the registry
def test_the_workflows_prompts_cover_exactly_the_registered_tasks():
    for name in ("paper", "guarded"):
        assert list(PROMPT_SETS[name]) == list(TASKS)
    assert {task: type(SingleAgent(task=task).formats["generator"]) for task in TASKS} == {
        "math": BoxedAnswer,
        "code": CodeAnswer,
    }


def test_an_unknown_task_is_refused_everywhere_with_the_valid_names():
    with pytest.raises(ValueError, match="'math', 'code'"):
        get_task("chess")
    with pytest.raises(ValueError, match="'math', 'code'"):
        SingleAgent(task="chess")
    with pytest.raises(ValueError, match="'math', 'code'"):
        EvalSettings(task="chess")
    with pytest.raises(SystemExit):  # argparse: invalid choice
        train_command(["eval_opt", "--task", "chess"])


def test_cli_picks_the_recipe_of_each_registered_task():
    for task in TASKS:
        assert train_command(["voting", "--task", task])[-1].endswith(f"voting_{task}.py")


@pytest.mark.parametrize("task", list(TASKS))
def test_evaluation_lengths_and_dataset_come_from_the_registry(task):
    spec = get_task(task)
    assert EvalSettings(task=task).max_completion_length == spec.eval_length
    assert EvalSettings(task=task, use_training_lengths=True).max_completion_length == spec.training_length
    assert spec.training_length < spec.eval_length


@pytest.mark.parametrize("task", list(TASKS))
def test_generated_rows_train_and_hold_out_on_different_seeds(task):
    spec = get_task(task)
    train = spec.train_dataset(spec.generated, seed=0)
    held_out = spec.eval_dataset(spec.generated, limit=20)
    assert len(train) == GENERATED_TRAIN_SIZE and len(held_out) == 20
    assert {"prompt", spec.ground_truth} <= set(held_out.column_names)
    assert held_out.to_list() == held_out_dataset(20, task).to_list()  # the toy evaluation's rows
    assert held_out.to_list() != spec.generator(spec.generated)(n=20, seed=0).to_list()


def test_the_toy_evaluation_reads_another_generator_of_the_task_by_name():
    rows = held_out_dataset(5, "math", "mod_search").to_list()
    assert rows == get_task("math").eval_dataset("mod_search", limit=5).to_list()
    assert all(row["prompt"][0]["content"].startswith("Which of the numbers") for row in rows)
    with pytest.raises(ValueError, match="its generators are \\['arithmetic', 'mod_search'\\]"):
        held_out_dataset(5, "math", "toy_code")


def test_the_math_reward_of_a_right_answer_counts_as_solved():
    spec = get_task("math")
    rows = spec.eval_dataset(spec.generated, limit=3).to_list()
    texts = [boxed(row[spec.ground_truth]) for row in rows] + [boxed("-99999")]
    completions = [[{"role": "assistant", "content": text}] for text in texts]
    rewards = spec.make_reward()(completions, answer=[row["answer"] for row in rows] + [rows[0]["answer"]])
    assert [solved(r) for r in rewards] == [True, True, True, False]
    assert spec.answer_checker(texts[0], rows[0]["answer"]) and not spec.answer_checker(texts[3], rows[0]["answer"])


def test_success_is_a_reward_of_at_least_one():
    assert [solved(r) for r in (1.0, 1.5, 0.999, 0.0, None, float("nan"))] == [True, True, False, False, False, False]


# ------------------------------------------------------------------------------------------- grading role outputs
def test_a_verdict_is_right_when_it_matches_the_answer_it_judged():
    episode = Episode(
        0,
        calls=[
            call("generator", boxed("5")),
            call("evaluator", boxed("Incorrect")),  # right: 5 is wrong
            call("generator", boxed("4")),
            call("evaluator", "looks fine"),  # no verdict: wrong when strict, Incorrect (also wrong) when read
            call("generator", boxed("4")),
            call("evaluator", boxed("Correct")),  # right
        ],
    )
    formats = EvalOpt().formats
    right = right_if_boxed_4(episode)
    strict = [g.right for g in grade_calls(formats, episode.calls, right, strict_verdicts=True)]
    assert strict == [False, True, True, False, True, True]
    wrong_answer_unread = Episode(0, calls=[call("generator", boxed("5")), call("evaluator", "hmm")])
    answers = right_if_boxed_4(wrong_answer_unread)
    assert grade_calls(formats, wrong_answer_unread.calls, answers, strict_verdicts=True)[1].right is False
    assert grade_calls(formats, wrong_answer_unread.calls, answers)[1].right is True  # read as Incorrect: right


def test_a_selection_and_a_synthesis_carry_the_candidates_they_chose_among():
    voting = Episode(
        0, calls=[call("generator", boxed(a), i) for i, a in enumerate("454")] + [call("aggregator", boxed("2"))]
    )
    grades = grade_calls(Voting().formats, voting.calls, right_if_boxed_4(voting))
    assert grades[-1].right is False and grades[-1].candidates == (True, False, True)
    orch = Episode(
        0,
        calls=[call("orchestrator", "STRATEGY 1: add\nSTRATEGY 2: count\nSTRATEGY 3: guess")]
        + [call("worker", boxed(a), i) for i, a in enumerate("455")]
        + [call("synthesizer", boxed("4"))],
    )
    grades = grade_calls(OrchWorkers().formats, orch.calls, right_if_boxed_4(orch))
    assert grades[0].right is None  # a plan is not graded
    assert [g.candidates for g in grades[1:4]] == [(), (), ()]  # parallel instances of one role
    assert grades[-1].right is True and grades[-1].candidates == (True, False, False)


def test_toy_quality_monitoring_and_role_rewards_agree_on_who_is_right():
    """The three readers of role correctness on one Voting batch: the toy evaluation's role quality, monitoring's
    regraded / selection metrics and the reference per-role rewards."""
    episodes = [
        Episode(0, calls=[call("generator", boxed(a), i) for i, a in enumerate(v)] + [call("aggregator", boxed(p))])
        for v, p in (("454", "2"), ("454", "1"), ("444", "3"), ("555", "1"))
    ]
    rows = [{"prompt": [{"role": "user", "content": "2 + 2"}], "answer": "4"}] * len(episodes)
    workflow = Voting()
    quality = role_quality(workflow, episodes, rows, "math")
    assert quality == {
        "aggregator/accuracy": 0.5,  # only where candidates disagree: the first two episodes
        "aggregator/chance": 2 / 3,
        "generator/accuracy": 7 / 12,
    }
    metrics = workflow_metrics(
        workflow, episodes, [0.0] * 4, lambda text, answer: text == boxed(answer), [r["answer"] for r in rows]
    )
    assert metrics["workflow/regraded/generator"] == quality["generator/accuracy"]
    assert metrics["workflow/selection_accuracy"] == 2 / 3  # episodes with a right candidate: all-right counts too

    def score(texts, score_rows):
        return [float(text == boxed(row["answer"])) for text, row in zip(texts, score_rows)]

    rewards = builtin_role_rewards("reference", workflow, episodes, rows, [0.0] * 4, score)
    assert [r[-1] for r in rewards] == [0.0, 1.0, 1.0, 0.0]
