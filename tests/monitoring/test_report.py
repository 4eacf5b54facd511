"""`trl-multiagent report RUN_DIR`: one self-contained HTML page from a run folder, read back as a reader sees it.

The run folder is built here as training leaves one (the log history, multiagent_config.json, the pickled training
arguments) plus an evaluation and an attribution result. The last test renders the page in headless Chromium
(slow; skipped without Chromium unless TRL_MA_REQUIRE_BROWSER=1, which CI sets).
"""

from __future__ import annotations

import base64
import json
import os
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from harness import load_script
from transformers import TrainerState

from trl_multiagent.checkpoints.workflow_config import workflow_config
from trl_multiagent.cli import main
from trl_multiagent.cli.report import load_training_args, report_html, settings_diff
from trl_multiagent.config import MultiAgentGRPOConfig
from trl_multiagent.workflows import EvalOpt

PNG = b"\x89PNG\r\n\x1a\n"


def make_run(folder: Path, steps: int = 12) -> Path:
    """A finished toy Eval-Opt run's folder: 12 logged steps with a judge_base_rate alarm at steps 9 and 11, the
    settings the toy preset changes, one evaluation row and one attribution."""
    folder.mkdir(parents=True, exist_ok=True)
    state = TrainerState(global_step=steps, max_steps=steps)
    for step in range(1, steps + 1):
        entry = {
            "step": step,
            "loss": 0.01,
            "workflow/success": 0.5 + 0.03 * step,
            "workflow/verdict_accuracy": 0.7,
            "role/generator/completion_length": 12.0 + step % 3,
            "role/evaluator/completion_length": 15.0 - step % 2,
            "role/generator/entropy": 0.09 - 0.002 * step,
            "role/evaluator/entropy": 0.04 + 0.001 * step,
            "role/generator/grad_norm_share": 0.9 - 0.01 * step,
            "role/evaluator/grad_norm_share": 0.1 + 0.01 * step,
            "role/evaluator/verdict_accuracy": 0.7 + 0.01 * step,
            "role/evaluator/verdict_balanced_accuracy": 0.7 - 0.01 * step,
            "role/generator/truncated_fraction": 0.0,
            "role/evaluator/truncated_fraction": 0.0,
        }
        if step in (9, 11):
            entry["alarm/evaluator/judge_base_rate"] = 1.0
        state.log_history.append(entry)
    state.save_to_json(str(folder / "trainer_state.json"))
    config = {
        "base_model": "toy",
        "workflow": workflow_config(EvalOpt(history="fresh", prompts="guarded")),  # as the trainer saves it
        "policy_sharing": "isolated",
        "role_to_adapter": {"generator": "generator", "evaluator": "evaluator"},
        "adapters": ["generator", "evaluator"],
    }
    (folder / "multiagent_config.json").write_text(json.dumps(config))
    args = MultiAgentGRPOConfig(
        output_dir=str(folder), use_cpu=True, bf16=False, learning_rate=1e-3, policy_sharing="isolated", max_steps=12
    )
    torch.save(args, folder / "training_args.bin")  # as Trainer.save_model does
    evaluation = {
        "run": folder.name,
        "step": steps,
        "mode": "trained",
        "workflow": "EvalOpt",
        "policy_sharing": "isolated",
        "dataset": "arithmetic",
        "num_problems": 50,
        "k": 1,
        "temperature": 0.0,
        "accuracy": 0.92,
        "mean_calls": 2.4,
    }
    (folder / "eval_results.jsonl").write_text(json.dumps(evaluation) + "\n")
    attribution = {
        "step": steps,
        "method": "shapley",
        "confidence": 0.95,
        "num_problems": 50,
        "roles": {"generator": ["generator"], "evaluator": ["evaluator"]},
        "shares": {
            "generator": {"value": 0.2, "low": 0.1, "high": 0.3},
            "evaluator": {"value": 0.04, "low": -0.02, "high": 0.1},
        },
        "interaction": {"value": 0.01, "low": -0.03, "high": 0.05},
        "gain": {"value": 0.25, "low": 0.14, "high": 0.36},
    }
    (folder / f"attribution-step{steps}-0123abcd.json").write_text(json.dumps(attribution))
    return folder


class _Page(HTMLParser):
    """The page's sections' tables (as rows of cell texts), its images' sources and what it loads from elsewhere."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.section_of: list[str] = []  # each table's section heading
        self.headings: list[str] = []
        self.images: list[str] = []
        self.external: list[str] = []
        self._cell: list[str] | None = None
        self._heading = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables.append([])
            self.section_of.append(self.headings[-1] if self.headings else "")
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "h2":
            self._heading = True
            self.headings.append("")
        elif tag == "img":
            self.images.append(attrs.get("src", ""))
        for name in ("src", "href"):
            if attrs.get(name) and not attrs[name].startswith("data:"):
                self.external.append(attrs[name])

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append("".join(self._cell))
            self._cell = None
        elif tag == "h2":
            self._heading = False

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._heading:
            self.headings[-1] += data


def read_page(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def tables(page: _Page, section: str) -> list[list[list[str]]]:
    return [table for table, heading in zip(page.tables, page.section_of) if heading == section]


def test_the_report_holds_settings_picture_tables_alarms_evaluations_and_attribution(tmp_path):
    page = read_page(report_html(make_run(tmp_path / "toy-eval-opt")))
    assert page.headings == [
        "Run",
        "Settings that differ from the defaults",
        "Summary picture",
        "First -> last",
        "Drift alarms",
        "Evaluations",
        "Attribution at step 12",
    ]
    assert not page.external  # self-contained: nothing to fetch
    (image,) = page.images
    assert image.startswith("data:image/png;base64,")
    assert base64.b64decode(image.split(",", 1)[1])[:8] == PNG

    (run,) = tables(page, "Run")
    assert [
        "workflow",
        "EvalOpt(task='math', prompts='guarded', parsing='reference', max_iterations=3, history='fresh')",
    ] in run
    (settings,) = tables(page, "Settings that differ from the defaults")
    assert settings[0] == ["setting", "this run", "default"]
    changed = {row[0]: row[1:] for row in settings[1:]}
    assert changed["learning_rate"] == ["0.001", "1e-06"] and changed["policy_sharing"] == ["isolated", "shared"]
    assert "seed" not in changed and "output_dir" not in changed  # as the defaults, and the folder itself

    workflow, roles = tables(page, "First -> last")
    assert workflow[1] == ["workflow/success", "0.59 -> 0.8"]  # 0.5 + 0.03 x the mean step of 1-5 (3) and 8-12 (10)
    assert roles[0] == ["role metric", "evaluator", "generator"]
    length = next(row for row in roles if row[0] == "completion_length")
    assert length[2] == "13.2 -> 13"  # the generator's 12 + step % 3: steps 1-5 sum to 66, steps 8-12 to 65

    (alarms,) = tables(page, "Drift alarms")
    assert [row[:3] for row in alarms] == [
        ["step", "role", "alarm"],
        ["9", "evaluator", "judge_base_rate"],
        ["11", "evaluator", "judge_base_rate"],
    ]
    assert "base rate" in alarms[1][3]  # what it means, from the alarm's own explanation
    assert alarms[1][4].startswith('What to do: set `role_rewards="balanced"`')  # and the setting that helps
    assert alarms[1][4].endswith("(docs/monitoring.md#a-judge-at-the-base-rate).")

    (evaluations,) = tables(page, "Evaluations")
    assert evaluations[1] == ["12", "EvalOpt (isolated)", "trained", "arithmetic", "50", "greedy", "92.0", "2.40"]
    (attribution,) = tables(page, "Attribution at step 12")
    assert attribution[1] == ["generator (generator)", "+20.0 [+10.0, +30.0]", "80%"]
    assert attribution[-1] == ["gain: all trained - all base", "+25.0 [+14.0, +36.0]", "100%"]


def test_settings_are_read_without_unpickling_code_a_run_folder_names(tmp_path):
    folder = make_run(tmp_path / "run")
    args = load_training_args(folder / "training_args.bin")
    assert isinstance(args, MultiAgentGRPOConfig) and args.learning_rate == 1e-3
    assert {name for name, _, _ in settings_diff(args)} >= {"learning_rate", "policy_sharing", "max_steps"}

    torch.save({"callback": os.system}, tmp_path / "hostile.bin")  # a pickle that would name a function to call
    with pytest.raises(ValueError, match="names posix.system.*does not unpickle it"):
        load_training_args(tmp_path / "hostile.bin")


def test_a_workflow_from_outside_the_package_is_not_imported(tmp_path, monkeypatch):
    folder = make_run(tmp_path / "run")
    (tmp_path / "their_flows.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\nclass Flow: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = json.loads((folder / "multiagent_config.json").read_text())
    config["workflow"]["import_path"] = "their_flows:Flow"
    (folder / "multiagent_config.json").write_text(json.dumps(config))
    page = report_html(folder)
    assert not (tmp_path / "imported").exists()  # the module was not run
    assert "The workflow their_flows:Flow is not imported by the report; judges are found in the log." in page


def test_the_cli_writes_the_page_into_the_run_folder_and_says_what_is_missing(tmp_path, capsys):
    folder = make_run(tmp_path / "run")
    assert main(["report", str(folder)]) == 0
    assert (folder / "report.html").is_file() and f"Wrote {folder / 'report.html'}" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "has no trainer_state.json" in capsys.readouterr().err


# After load, the page's images' natural widths and its tables' row counts, written where --dump-dom shows them.
PROBE = """<script>
window.addEventListener("load", () => {
  const widths = [...document.images].map((image) => image.naturalWidth);
  const rows = [...document.querySelectorAll("table")].map((table) => table.rows.length);
  document.body.setAttribute("data-probe", JSON.stringify({widths, rows}));
});
</script>"""


@pytest.mark.slow
def test_the_report_renders_in_chromium_with_its_picture_loaded(tmp_path):
    shots = load_script("scripts/docs_screenshots.py")
    chromium = shots.find_chromium()
    if chromium is None:
        if os.environ.get("TRL_MA_REQUIRE_BROWSER") == "1":
            pytest.fail("TRL_MA_REQUIRE_BROWSER=1 but Chromium is missing (apt-get install chromium)")
        pytest.skip("Chromium is missing (set TRL_MA_REQUIRE_BROWSER=1 to fail instead)")
    folder = make_run(tmp_path / "run")
    assert main(["report", str(folder)]) == 0
    probed = tmp_path / "probed.html"  # the page as written, and a script that reports what the browser loaded
    probed.write_text((folder / "report.html").read_text().replace("</body>", PROBE + "</body>"))
    dom = shots.rendered_dom(chromium, probed)
    (probe,) = [attrs["data-probe"] for tag, attrs in _tags(dom) if tag == "body"]
    loaded = json.loads(probe)
    assert loaded["widths"] == [1300]  # the picture decoded: 13 inches at 100 dpi
    assert len(loaded["rows"]) == 7 and all(rows > 1 for rows in loaded["rows"])
    page = read_page(dom)
    assert len(tables(page, "Drift alarms")[0]) == 3 and tables(page, "Settings that differ from the defaults")


def _tags(html: str) -> list[tuple[str, dict[str, str]]]:
    found = []

    class Tags(HTMLParser):
        def handle_starttag(self, tag, attrs):
            found.append((tag, {key: value or "" for key, value in attrs}))

    Tags().feed(html)
    return found
