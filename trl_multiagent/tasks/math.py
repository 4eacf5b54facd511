r"""Math task: DAPO-Math-17K rows, the last ``\boxed{}`` of an answer, and a symbolic-equivalence reward.

Rows: ``prompt`` = one user message (the problem, then an instruction to reason and box the final answer; its
``"problem"`` key holds the problem alone, which the workflows give their roles) and ``answer`` (str) = the ground
truth as LaTeX text, e.g. ``"34"`` or ``"\frac{3}{28}"``. DAPO's problem is its ``prompt`` text verbatim, "Answer:"
wrapper included, as the paper gives it to its workflows; ``strip_answer_wrapper=True`` removes the wrapper.

The reward follows the paper's grader: text after ``</think>`` if present, the last ``\boxed{...}`` (the rule of
``parse_rules.last_boxed``, which the workflows and the metrics use too), 1.0 when
``math-verify`` finds it equivalent to the ground truth (``\dfrac{1}{2}`` = ``0.5`` = ``1/2``, ``x = 3`` = ``3``,
units, ``\%``, ``\$``, thousands separators and spacing ignored), else 0.0; no box scores 0.0.
"""

from __future__ import annotations

import logging
import threading
from functools import lru_cache
from typing import Any

from datasets import Dataset
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from ..common.parse_rules import last_boxed
from .rows import check_split, field, published_rows, take

logger = logging.getLogger(__name__)

# The paper loads this deduplicated copy (config "en") and holds out 10% with seed 42 as its validation set.
# The original release, "BytedTsinghua-SIA/DAPO-Math-17k" (~100 copies of each problem), is also accepted.
DAPO_MATH_ID = "open-r1/DAPO-Math-17k-Processed"
DAPO_MATH_CONFIG = "en"
TEST_FRACTION, SPLIT_SEED = 0.1, 42
MATH_INSTRUCTION = "Reason step by step, then put the final answer alone inside \\boxed{}."
# DAPO wraps every problem in an "Answer: $Answer" instruction. The paper keeps it (the workflows' own requests then
# also ask for \boxed{}, the only format the reward reads); `strip_answer_wrapper` removes it, so the model does not
# see two answer formats.
_DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
_DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:".'
# Boxed content is the only candidate, so it is parsed first; ExprExtractionConfig catches plain "1/2", "0.5".
_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def math_prompt(problem: str) -> list[dict[str, str]]:
    """The conversational prompt of a math row: one user turn with the problem and the boxed-answer rule.

    The ``"problem"`` key keeps the problem without the rule: a chat template reads only ``role`` and ``content``,
    and ``workflows.problem_text`` gives judges the problem rather than the solver's instruction.
    """
    problem = problem.strip()
    return [{"role": "user", "content": f"{problem}\n\n{MATH_INSTRUCTION}", "problem": problem}]


def _dapo_row(row: dict[str, Any], index: int, source: str, strip_answer_wrapper: bool) -> dict[str, Any]:
    if "solution" in row or isinstance(row.get("prompt"), str):  # open-r1 Processed: the wrapped text, the answer
        text, answer = field(row, index, source, "prompt"), field(row, index, source, "solution")
    else:  # original release: prompt is a chat list, the answer sits in reward_model.ground_truth
        messages = field(row, index, source, "prompt")
        text = field({"content": messages[0].get("content")}, index, source, "content")
        answer = field(row, index, source, "reward_model", "ground_truth")
    if not isinstance(text, str):
        raise ValueError(f"{source}: row {index} has a 'prompt' of type {type(text).__name__}; expected text.")
    problem = text.removeprefix(_DAPO_PREFIX).removesuffix(_DAPO_SUFFIX) if strip_answer_wrapper else text
    boxed = extract_boxed(str(answer))  # some ground truths are themselves boxed; grade against the content
    return {"prompt": math_prompt(problem), "answer": boxed if boxed is not None else str(answer).strip()}


def load_dapo_math(
    split: str = "train",
    path_or_id: str = DAPO_MATH_ID,
    limit: int | None = None,
    *,
    strip_answer_wrapper: bool = False,
    bad_rows: str = "stop",
) -> Dataset:
    """DAPO-Math-17K as TRL rows (``prompt``, ``answer``), split like the paper (10% test, seed 42).

    ``path_or_id``: a Hub id (``load_dataset``; config ``en`` for ``DAPO_MATH_ID``) or a local .jsonl/.parquet file
    in the published schema. ``limit`` keeps the first rows of the split. The problem is the row's prompt text as
    published, as the paper uses it; ``strip_answer_wrapper=True`` drops DAPO's "Answer:" instructions around it.
    ``bad_rows``: what a row that cannot be read does (``rows.published_rows``): "stop" or "skip".
    """
    check_split(split)
    rows, columns = published_rows(
        path_or_id,
        hub_id=DAPO_MATH_ID,
        hub_config=DAPO_MATH_CONFIG,
        to_row=_dapo_row,
        bad_rows=bad_rows,
        strip_answer_wrapper=strip_answer_wrapper,
    )
    if "solution" not in columns:  # the original release repeats each problem ~100 times
        seen: set[str] = set()
        rows = rows.filter(lambda r: not (r["prompt"][0]["content"] in seen or seen.add(r["prompt"][0]["content"])))
    parts = rows.select_columns(["prompt", "answer"]).train_test_split(test_size=TEST_FRACTION, seed=SPLIT_SEED)
    return take(parts[split], limit)


def extract_boxed(text: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (or ``\fbox``, or ``\boxed 5``) after any ``</think>``; None if absent.

    ``parse_rules.last_boxed``: one rule for the reward, the workflows and the metrics.
    """
    return last_boxed(text)


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The text of a TRL completion: a plain string, or the last message of a conversational completion."""
    if isinstance(completion, str):
        return completion
    if not completion:
        return ""
    content = completion[-1].get("content", "")
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


def _timeout() -> int | None:
    # math-verify's timeouts use SIGALRM, which only the main thread may set; elsewhere run without one.
    return 5 if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def _parse_gold(answer: str) -> tuple:
    return tuple(parse(f"${answer}$", _EXTRACTION, parsing_timeout=_timeout()))


def is_equivalent(predicted: str, answer: str) -> bool:
    """Whether the boxed content ``predicted`` equals the ground truth ``answer`` (math-verify)."""
    predicted = predicted.strip().rstrip(".").strip()  # "34." ends a sentence; it isn't part of the number
    if not predicted:
        return False
    gold = _parse_gold(answer.strip())
    pred = parse(f"\\boxed{{{predicted}}}", _EXTRACTION, parsing_timeout=_timeout())
    return bool(gold and pred and verify(list(gold), pred, timeout_seconds=_timeout()))


def math_reward(completions: list, answer: list[str], **kwargs: Any) -> list[float]:
    r"""TRL reward: 1.0 when the last ``\boxed{}`` of a completion equals ``answer``, else 0.0 (never raises)."""
    rewards = []
    for completion, truth in zip(completions, answer, strict=True):
        try:
            boxed = extract_boxed(completion_text(completion))
            rewards.append(float(boxed is not None and is_equivalent(boxed, str(truth))))
        except Exception:  # noqa: BLE001 - a reward must score, not crash training; log what failed
            logger.warning("math_reward could not grade a completion against %r; scoring 0.0", truth, exc_info=True)
            rewards.append(0.0)
    return rewards


def math_answer_checker(text: str, answer: str) -> bool:
    """Whether one role output's last `\\boxed{}` is equivalent to the ground truth (for per-role regrading)."""
    return math_reward([text], [answer])[0] == 1.0
