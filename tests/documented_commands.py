"""The commands README.md and docs/ show a user, read from the Markdown, and what runs each of them as
tests/recipes/test_documented_commands.py checks it (its docstring says how each kind is handled).

Read as commands: every line of a fenced code block (```bash or an untyped one; continuation lines joined, `&&` and
`;` split, a `for VAR in ...` loop's variable set to its first value), and every inline code span of the prose and
tables, that runs one of the project's entry points: ``accelerate launch``, ``torchrun``, ``trl-multiagent``,
``python recipes/...``, ``python benchmarks/...``, ``python scripts/...``, ``python -m trl_multiagent...``. Leading
``VAR=value`` assignments and ``nice -n N`` are not part of the command. A last word ``...`` means "and more flags":
what comes before it is checked (after a flag it stands for the flag's value). A program named in a sentence
(``accelerate launch``, ``trl-multiagent report``: no script, no arguments) is no command. A word that still holds a
stand-in (``...``, ``<name>``, ``$VAR``, ``[--optional]``, ``RUN_DIR``, the reader's ``my_pkg``) makes the text a
pattern (``recipes/<recipe>.py``), not a command: it is collected as such, not run.

A documented refusal (a command shown to fail) carries ``# refused: WORDS`` at the end of its line: the test then
requires the refusal, with WORDS in its message.

Run as a script (``python tests/documented_commands.py RESULTS FOLDER``), this module is the worker those checks run
in: it reads jobs (JSON) on stdin, runs each in this one process, in FOLDER (its script as ``__main__``, its
environment variables set for it alone), and writes each outcome (exit code, the ends of stdout and stderr) as JSON
to the file RESULTS.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import runpy
import shlex
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ENTRY_POINTS = ("accelerate", "torchrun", "trl-multiagent", "python")
PYTHON_PLACES = ("recipes/", "benchmarks/", "scripts/")
REFUSED = re.compile(r"#\s*refused:\s*(.+)$")
SEPARATORS = {"&&", "||", ";", "|", "&"}
# A word standing for something the reader supplies: `...`, `<recipe>`, `$VAR`, `[--optional flag]`, an upper-case
# name (`RUN_DIR`, `HOST`, `N`), or the reader's own package (`my_pkg.flows:DraftCritique`).
PLACEHOLDER = re.compile(r"\.\.\.|<[A-Za-z_ -]+>|^<|>$|\$\w+|\$\{|^\[|^[A-Z][A-Z_]*$|^my_(pkg|package)\b")


@dataclass(frozen=True)
class DocCommand:
    """One command a page shows."""

    where: str  # page:line
    text: str  # as written (continuation lines joined)
    argv: tuple[str, ...]  # its words, without leading assignments or `nice`, and without a last `...`
    refused: str | None = None  # a documented refusal: words its message holds
    placeholder: str | None = None  # the word that makes it a pattern, not a command

    @property
    def page(self) -> str:
        return self.where.split(":")[0]


def documented_commands(pages: list[Path] = PAGES) -> list[DocCommand]:
    """Every command (and pattern) of ``pages``, in page order."""
    found: list[DocCommand] = []
    for page in pages:
        found += _commands_of(page)
    return found


def _commands_of(page: Path) -> list[DocCommand]:
    name = str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name
    found: list[DocCommand] = []
    lines = page.read_text().splitlines()
    fence, loop_values, pending, start = None, {}, "", 0
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip()
            loop_values, pending = {}, ""
            continue
        if fence is None:
            for span in re.findall(r"`([^`]+)`", line):
                found += _read(span, f"{name}:{number}", {})
            continue
        if fence not in ("", "bash", "sh", "shell"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        found += _read(pending + stripped, f"{name}:{start}", loop_values)
        pending = ""
    return found


def _read(text: str, where: str, loop_values: dict[str, str]) -> list[DocCommand]:
    """The commands of one logical shell line (``loop_values`` gathers `for` loops' variables as they start)."""
    refused = REFUSED.search(text)
    try:
        lexer = shlex.shlex(text, posix=True, punctuation_chars="&;|")
        lexer.whitespace_split, lexer.commenters = True, "#"
        words = list(lexer)
    except ValueError:  # not shell (an unbalanced quote in prose)
        return []
    commands, segment = [], []
    for word in [*words, ";"]:
        if word not in SEPARATORS:
            segment.append(word)
            continue
        if segment[:1] == ["for"] and len(segment) >= 4 and segment[2] == "in":
            loop_values[segment[1]] = segment[3]
        elif segment:
            while segment and segment[0] in ("do", "then"):
                segment = segment[1:]
            command = _command(segment, text, where, loop_values, refused.group(1).strip() if refused else None)
            if command is not None:
                commands.append(command)
        segment = []
    return commands


def _command(words: list[str], text: str, where: str, loop_values: dict[str, str], refused: str | None):
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", words[0]):
        words = words[1:]
    if words[:1] == ["nice"]:
        words = words[3:] if words[1:2] == ["-n"] else words[1:]
    if not words or words[0] not in ENTRY_POINTS:
        return None
    if words[0] == "accelerate" and words[1:2] != ["launch"]:
        return None
    if words[0] == "python" and not (
        words[1:2] == ["-m"]
        and words[2:3]
        and words[2].startswith("trl_multiagent")
        or words[1:2]
        and words[1].startswith(PYTHON_PLACES)
    ):
        return None
    launches = words[0] in ("accelerate", "torchrun")
    if len(words) < 3 or launches and not any(word.endswith(".py") or "recipes/" in word for word in words):
        return None  # the program's name in a sentence (`trl-multiagent report`, `accelerate launch`), no command
    if words[-1] == "..." and not words[-2].startswith("--"):  # "and more flags"; after a flag, its value's stand-in
        words = words[:-1]
    words = [re.sub(r"\$(\w+)", lambda m: loop_values.get(m.group(1), m.group(0)), word) for word in words]
    placeholder = next((word for word in words if PLACEHOLDER.search(word)), None)
    return DocCommand(where, text.strip(), tuple(words), refused, placeholder)


# ------------------------------------------------------------------------------------------------------------ jobs
@dataclass
class Job:
    """One thing the worker runs: a script (or module) with its arguments, as ``__main__``."""

    argv: list[str]  # [script.py, args...] or ["-m", module, args...]
    env: dict[str, str] = field(default_factory=dict)  # set for this job alone
    parse_only: bool = False  # stop once its argument parser read the arguments (argparse scripts)

    def key(self) -> str:
        return json.dumps([self.argv, sorted(self.env.items()), self.parse_only])


@dataclass
class Outcome:
    code: int
    out: str
    err: str


class _Parsed(Exception):
    """Raised by an argument parser once it read every argument (``Job.parse_only``)."""


@contextlib.contextmanager
def _stop_after_parsing():
    """argparse parsers stop the script (``_Parsed``) once they read all its arguments; an unknown flag still stops
    it with argparse's own error (exit 2)."""
    parse_known = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        parsed, extra = parse_known(self, args, namespace)
        if not extra:
            raise _Parsed
        return parsed, extra

    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = parse_known


def run_job(job: Job) -> Outcome:
    """Run ``job`` in this process, as ``python ARGV`` would in the working directory."""
    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_argv, saved_path = dict(os.environ), list(sys.argv), list(sys.path)
    os.environ.update(job.env)
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            with _stop_after_parsing() if job.parse_only else contextlib.nullcontext():
                if job.argv[0] == "-m":
                    sys.argv = [job.argv[1], *job.argv[2:]]
                    runpy.run_module(job.argv[1], run_name="__main__", alter_sys=True)
                else:
                    sys.argv = list(job.argv)
                    sys.path.insert(0, str(Path(job.argv[0]).resolve().parent))
                    runpy.run_path(job.argv[0], run_name="__main__")
    except _Parsed:
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            err.write(f"{stop.code}\n")
    except BaseException:  # noqa: BLE001 - a job's failure is its outcome
        code = 1
        err.write(traceback.format_exc())
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv, sys.path = saved_argv, saved_path
    return Outcome(code, out.getvalue()[-4000:], err.getvalue()[-6000:])


def main(results: str, folder: str) -> None:
    os.chdir(folder)
    jobs = [Job(**job) for job in json.load(sys.stdin)]
    Path(results).write_text(json.dumps([run_job(job).__dict__ for job in jobs]))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
