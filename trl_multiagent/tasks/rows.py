"""Reading a task's rows from the Hub or from a local file in the same schema, and naming broken rows."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset

from .bad_rows import SHOWN, BadRow, check_bad_rows_policy, prompt_problem

logger = logging.getLogger(__name__)

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_rows(path_or_id: str, hub_id: str, hub_config: str | None) -> Dataset | list[dict | BadRow]:
    """All rows of ``path_or_id``: a local .jsonl/.json/.parquet file, or a Hub dataset's ``train`` split.

    A .jsonl file is read line by line, so that a line which is not UTF-8 or not a JSON object, or a field whose type
    differs from row to row, is one bad row (a ``BadRow`` in the list) rather than a file that cannot be read.
    ``hub_config`` applies only when ``path_or_id`` is ``hub_id`` (the published dataset the loader knows).
    """
    path = Path(path_or_id)
    if path.suffix in LOCAL_FORMATS:
        if not path.is_file():
            raise FileNotFoundError(f"No dataset file at {path}; give an existing .jsonl/.parquet file or a Hub id.")
        if path.suffix == ".jsonl":
            return read_jsonl(path)
        return load_dataset(LOCAL_FORMATS[path.suffix], data_files=str(path), split="train")
    return load_dataset(path_or_id, hub_config if path_or_id == hub_id else None, split="train")


def read_jsonl(path: Path) -> list[dict | BadRow]:
    """Each non-blank line of ``path`` as a dict, or as the BadRow saying why it is not one (rows count from 0)."""
    rows: list[dict | BadRow] = []
    with open(path, "rb") as f:
        for line in f:
            if not line.strip():
                continue
            index = len(rows)
            try:
                row = json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as error:
                rows.append(
                    BadRow(index, f"{path}: row {index} is not valid UTF-8 ({error.reason} at byte {error.start})")
                )
                continue
            except json.JSONDecodeError as error:
                rows.append(BadRow(index, f"{path}: row {index} is not valid JSON ({error.msg})"))
                continue
            rows.append(row if isinstance(row, dict) else BadRow(index, f"{path}: row {index} is not a JSON object"))
    return rows


def published_rows(
    path_or_id: str,
    *,
    hub_id: str,
    hub_config: str | None,
    to_row: Callable[..., dict],
    bad_rows: str = "stop",
    **row_kwargs: Any,
) -> tuple[Dataset, list[str]]:
    """Every row of a published dataset (``load_rows``) made into a TRL row by ``to_row(row, index,
    source=path_or_id, **row_kwargs)``, and the published columns (a loader tells releases of a dataset apart by
    them). A row that cannot be read or made into a TRL row is bad: ``bad_rows="stop"`` raises one ValueError naming
    every such row and why; ``"skip"`` leaves them out with a warning naming them."""
    check_bad_rows_policy(bad_rows)
    raw = load_rows(path_or_id, hub_id, hub_config)
    columns = (
        raw.column_names
        if isinstance(raw, Dataset)
        else list(dict.fromkeys(k for r in raw if isinstance(r, dict) for k in r))
    )
    rows, bad = [], []
    for index, row in enumerate(raw):
        if isinstance(row, BadRow):
            bad.append(row)
            continue
        try:
            made = to_row(row, index, source=path_or_id, **row_kwargs)
        except (ValueError, TypeError, AttributeError, KeyError) as error:
            bad.append(
                BadRow(
                    index,
                    str(error)
                    if isinstance(error, ValueError)
                    else f"{path_or_id}: row {index}: {type(error).__name__}: {error}",
                )
            )
            continue
        text_problem = prompt_problem(made.get("prompt"))
        if text_problem:
            bad.append(BadRow(index, f"{path_or_id}: row {index}: {text_problem}"))
            continue
        rows.append(made)
    if bad:
        report = (
            f"{len(bad)} of {len(raw)} rows of {path_or_id} are malformed:\n"
            + "\n".join(f"  {row.reason}" for row in bad[:SHOWN])
            + (f"\n  ... and {len(bad) - SHOWN} more" if len(bad) > SHOWN else "")
        )
        if bad_rows == "stop" or not rows:
            raise ValueError(
                f"{report}\nFix or drop these rows, or leave them out with `bad_rows='skip'` (`--bad_rows skip`)."
            )
        logger.warning("%s\nLeft out (bad_rows='skip').", report)
    return Dataset.from_list(rows), columns


def check_split(split: str) -> None:
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test' (the paper's held-out evaluation split), got {split!r}.")


def take(dataset: Dataset, limit: int | None) -> Dataset:
    if limit is None:
        return dataset
    if limit < 0:
        raise ValueError(f"limit must be >= 0 or None (all rows), got {limit}.")
    return dataset.select(range(min(limit, len(dataset))))


def field(row: dict[str, Any], index: int, source: str, name: str, *path: str) -> Any:
    """``row[name][path...]``, or a ValueError naming the row and the missing field."""
    value: Any = row.get(name)
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if value is None or (isinstance(value, str | list) and len(value) == 0):
        dotted = ".".join((name, *path))
        raise ValueError(
            f"{source}: row {index} has no {dotted!r} (missing, null or empty). Fix or drop that row; every row "
            f"needs the fields of the published schema."
        )
    return value
