"""Reading a task's rows from the Hub or from a local file in the same schema, and naming broken rows."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from datasets import Dataset, load_dataset

LOCAL_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def load_rows(path_or_id: str, hub_id: str, hub_config: str | None) -> Dataset:
    """All rows of ``path_or_id``: a local .jsonl/.json/.parquet file, or a Hub dataset's ``train`` split.

    ``hub_config`` applies only when ``path_or_id`` is ``hub_id`` (the published dataset the loader knows).
    """
    path = Path(path_or_id)
    if path.suffix in LOCAL_FORMATS:
        if not path.is_file():
            raise FileNotFoundError(f"No dataset file at {path}; give an existing .jsonl/.parquet file or a Hub id.")
        return load_dataset(LOCAL_FORMATS[path.suffix], data_files=str(path), split="train")
    return load_dataset(path_or_id, hub_config if path_or_id == hub_id else None, split="train")


def published_rows(
    path_or_id: str, *, hub_id: str, hub_config: str | None, to_row: Callable[..., dict], **row_kwargs: Any
) -> tuple[Dataset, list[str]]:
    """Every row of a published dataset (``load_rows``) made into a TRL row by ``to_row(row, index,
    source=path_or_id, **row_kwargs)``, and the published columns (a loader tells releases of a dataset apart by
    them)."""
    raw = load_rows(path_or_id, hub_id, hub_config)
    rows = raw.map(
        to_row, with_indices=True, fn_kwargs={"source": path_or_id, **row_kwargs}, remove_columns=raw.column_names
    )
    return rows, raw.column_names


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
