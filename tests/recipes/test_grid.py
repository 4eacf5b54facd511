"""The grid script: one launch per cell plus controls, and the report from what runs left behind."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest
from harness import ROOT, run_offline

from trl_multiagent.evaluation import read_results


def grid(*args: str, timeout: int = 120) -> str:
    return run_offline([sys.executable, "recipes/grid.py", *args], cwd=ROOT, timeout=timeout).stdout


@pytest.mark.slow
def test_dry_run_prints_one_launch_per_cell_plus_controls(tmp_path):
    out = grid(
        "--dry-run",
        "--models",
        "org/m1",
        "org/m2",
        "--tasks",
        "math",
        "code",
        "--workflows",
        "eval_opt",
        "voting",
        "--seed",
        "7",
        "--max_steps",
        "30",
        "--save_steps",
        "10",
        "--output_root",
        str(tmp_path),
        "--recipe_config",
        "math=recipes/configs/cpu.yaml",
    )
    lines = out.splitlines()
    launches = [line for line in lines if line.startswith("accelerate launch ")]
    assert len(launches) == 2 * 2 * (2 * 2 + 1)  # models x tasks x (workflows x sharings + SA-RL)
    assert all("--seed 7 --max_steps 30 --save_steps 10" in line for line in launches)
    assert sum("recipes/single_agent_code.py" in line for line in launches) == 2
    assert sum("recipes/voting_math.py" in line and "--policy_sharing isolated" in line for line in launches) == 2
    assert all(("--config recipes/configs/cpu.yaml" in line) == ("_math.py" in line) for line in launches)
    evaluations = [line for line in lines if line.startswith("python recipes/evaluate.py ")]
    # per model x task: 5 runs, 3 base, 2 transfers, and (sampled, paper_eval.yaml's T=0.7) SA-RL best-of-n
    # matched to each of the 4 workflow cells, and judged by each of the 2 Eval-Opt cells
    assert len(evaluations) == 2 * 2 * (5 + 3 + 2 + 4 + 2)
    best_of = f"--run_dir {tmp_path}/m1/math/single_agent --best_of_calls {tmp_path}/m1/math/voting-shared --select"
    assert sum(best_of in line and line.endswith("--checkpoints final") for line in evaluations) == 1
    assert sum("--mode base" in line for line in evaluations) == 2 * 2 * 3
    transfer = f"--run_dir {tmp_path}/m1/math/single_agent --mode transfer --workflow {tmp_path}/m1/math/voting-shared"
    assert any(transfer in line for line in evaluations)
    rendering = "--chat_rendering reference_qwen --chat_template_kwargs '{\"enable_thinking\": false}'"
    assert all(rendering in line for line in evaluations if "--task math" in line)  # as cpu.yaml trains
    assert not any("--chat_rendering" in line for line in evaluations if "--task code" in line)  # the paper preset's


def test_report_from_existing_runs(tmp_path):
    run = tmp_path / "m" / "math" / "voting-isolated"
    rows = [
        {
            "step": s,
            "accuracy": a,
            "workflow": "Voting",
            "policy_sharing": "isolated",
            "mode": "trained",
            "model": "org/m",
            "dataset": "arithmetic",
            "k": 1,
            "trained_workflow": "Voting",
        }
        for s, a in ((2, 0.25), (4, 0.75), (6, 0.5))
    ]
    (run / "checkpoint-6").mkdir(parents=True)
    (run / "eval_results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    history = [
        {"step": s, "role/generator/policy_ratio": r, "role/generator/completion_length": 10.0 * s}
        for s, r in ((2, 1.0), (4, 1.5), (6, 1.2))
    ]
    (run / "checkpoint-6" / "trainer_state.json").write_text(json.dumps({"global_step": 6, "log_history": history}))

    out = grid(
        "--report_only",
        "--models",
        "org/m",
        "--tasks",
        "math",
        "--workflows",
        "voting",
        "--policy_sharing",
        "isolated",
        "--output_root",
        str(tmp_path),
    )
    expected = "| org/m | arithmetic | Voting | isolated | trained | 75.0 (4) | 50.0 (6) | 25.0 | - | - |"
    assert expected in out and expected in (tmp_path / "table.md").read_text()
    instability = json.loads((tmp_path / "instability.json").read_text())
    assert instability[str(run)]["generator"]["policy_ratio_max"] == 1.5
    assert instability[str(tmp_path / "m" / "math" / "single_agent")] == {}  # never trained: nothing to summarise
    if importlib.util.find_spec("matplotlib") is not None:
        plots = tmp_path / "plots"
        assert (plots / "accuracy-m-math.png").is_file()
        assert (plots / "m-math-voting-isolated-completion_length.png").is_file()
        assert not (plots / "m-math-voting-isolated-perplexity.png").exists()  # not logged by this run


@pytest.mark.slow
def test_tiny_grid_end_to_end(tiny_model_dir, tmp_path):
    out = grid(
        "--models",
        tiny_model_dir,
        "--tasks",
        "math",
        "--workflows",
        "voting",
        "--policy_sharing",
        "shared",
        "--accelerate_config",
        "accelerate_configs/cpu.yaml",
        "--recipe_config",
        "math=recipes/configs/cpu.yaml",
        "--max_steps",
        "2",
        "--save_steps",
        "1",
        "--output_root",
        str(tmp_path),
        "--recipe_args",
        "--max_completion_length 6",
        "--eval_dataset",
        "math=arithmetic",
        "--eval_args",
        "--limit 2 --max_completion_length 6",
        timeout=1200,
    )
    table = (tmp_path / "table.md").read_text()
    for cell in ("| Voting | shared | trained |", "| Voting | - | base |", "| Voting | isolated | transfer |"):
        assert cell in table, out[-3000:]
    assert "| SingleAgent | isolated | trained |" in table


@pytest.mark.slow
def test_toy_grid_covers_math_and_code_with_their_presets(tmp_path):
    out = grid(
        "--dry-run",
        "--models",
        "toy",
        "--tasks",
        "math",
        "code",
        "--output_root",
        str(tmp_path),
        "--recipe_config",
        "math=recipes/configs/toy.yaml",
        "code=recipes/configs/toy_code.yaml",
        "--eval_dataset",
        "math=arithmetic",
        "code=toy_code",
        "--max_steps",
        "30",
        "--save_steps",
        "10",
    )
    launches = [line for line in out.splitlines() if line.startswith("accelerate launch ")]
    code = [line for line in launches if "_code.py" in line]
    assert len(code) == len(launches) // 2 == 3 * 2 + 1
    assert all("--config recipes/configs/toy_code.yaml" in line for line in code)
    evaluations = [line for line in out.splitlines() if line.startswith("python recipes/evaluate.py ")]
    assert all("--dataset_name toy_code" in line for line in evaluations if "--task code" in line)
    assert all("--chat_rendering tokenizer" in line for line in evaluations)  # as the toy presets train
    assert sum("--task code" in line for line in evaluations) == len(evaluations) // 2


@pytest.mark.slow
def test_attribution_is_evaluated_for_isolated_cells_and_reported_per_workflow(tmp_path):
    from trl_multiagent.evaluation.attribution import attribution

    cells = "--models org/m --tasks math --workflows voting".split()
    out = grid("--dry-run", *cells, "--attribution", "--output_root", str(tmp_path))
    attributions = [line for line in out.splitlines() if "--attribution" in line.split()]
    assert len(attributions) == 1 and f"--run_dir {tmp_path}/m/math/voting-isolated " in attributions[0]

    run = tmp_path / "m" / "math" / "voting-isolated"
    run.mkdir(parents=True)
    per_problem = {
        frozenset(): [0.0, 0.0],
        frozenset(["generator"]): [1.0, 0.0],
        frozenset(["aggregator"]): [0.0, 0.0],
        frozenset(["generator", "aggregator"]): [1.0, 1.0],
    }
    result = attribution(per_problem, ["generator", "aggregator"], bootstrap=20)
    result.update(
        run=str(run),
        step=6,
        workflow="Voting",
        policy_sharing="isolated",
        roles={"generator": ["generator"], "aggregator": ["aggregator"]},
    )
    (run / "attribution-step6-abc.json").write_text(json.dumps(result))
    out = grid("--report_only", *cells, "--output_root", str(tmp_path))
    # generator: 1/2 (0.5 - 0) + 1/2 (1 - 0) = 0.75; aggregator: 1/2 (0 - 0) + 1/2 (1 - 0.5) = 0.25
    assert "| generator (generator) | +75.0 [" in out and "| aggregator (aggregator) | +25.0 [" in out
    assert "| interaction | +50.0 [" in (tmp_path / "attribution.md").read_text()
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "plots" / "attribution-m-math.png").is_file()


def load_grid():
    spec = importlib.util.spec_from_file_location("grid_recipe", ROOT / "recipes" / "grid.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dry_run(capsys, *args: str) -> tuple[list[str], list[str]]:
    grid_module = load_grid()
    assert grid_module.main(grid_module.parse_args(["--dry-run", *args])) == 0
    lines = capsys.readouterr().out.splitlines()
    launches = [line for line in lines if line.startswith("accelerate launch ")]
    return launches, [line for line in lines if line.startswith("python recipes/evaluate.py ")]


def test_toy_preset_prints_every_family_and_seed(capsys, tmp_path):
    launches, evaluations = dry_run(capsys, "--preset", "toy", "--seeds", "1", "2", "--output_root", str(tmp_path))
    assert len(launches) == 3 * 2 * (3 * 2 + 1)  # families x seeds x (workflows x sharings + SA-RL)
    assert all("--config_file accelerate_configs/cpu.yaml" in line for line in launches)
    assert all("--max_steps 30 --save_steps 10" in line for line in launches)
    families = (
        ("arithmetic", "toy", "toy.yaml", "math"),
        ("toy_code", "toy", "toy_code.yaml", "code"),
        ("mod_search", "toy-search", "toy.yaml", "math"),  # the shipped model trained on it
    )
    for family, model, config, task in families:
        for seed in (1, 2):
            folder = f"--output_dir {tmp_path}/{model}/{family}/seed-{seed}/"
            ours = [line for line in launches if folder in line]
            assert len(ours) == 7 and all(f"--seed {seed} " in line for line in ours)
            assert all(f"--config recipes/configs/{config} --dataset_name {family} " in line for line in ours)
            assert all(f"_{task}.py " in line and f"--model_name_or_path {model} " in line for line in ours)
            evaluated = [line for line in evaluations if f"--run_dir {tmp_path}/{model}/{family}/seed-{seed}/" in line]
            # 7 runs, 3 base-model workflows + SA-RL's, 3 transfers; greedy and sampled each; SA-RL best-of-n
            # matched to each of the 6 workflow cells, and judged by each of the 2 Eval-Opt cells, sampled only
            assert len(evaluated) == (7 + 4 + 3) * 2 + 6 + 2
            assert all(f"--dataset_name {family} " in line and f"--seed {seed} " in line for line in evaluated)
            judged = [line for line in evaluated if "--select judge" in line]
            best_of = [line for line in evaluated if "--best_of_calls" in line and line not in judged]
            sa_rl = f"--run_dir {tmp_path}/{model}/{family}/seed-{seed}/single_agent --best_of_calls"
            assert len(best_of) == 6 and all(
                line.startswith(f"python recipes/evaluate.py {sa_rl}") for line in best_of + judged
            )
            for sharing, line in zip(("shared", "isolated"), judged):  # judged by the cell whose calls set n
                cell = f"{tmp_path}/{model}/{family}/seed-{seed}/eval_opt-{sharing}"
                assert f"--best_of_calls {cell} --select judge --judge {cell} " in line
            matched = [line.split("--best_of_calls ")[1].split()[0] for line in best_of]
            workflows = ("eval_opt", "voting", "orch_workers")
            folder = f"{tmp_path}/{model}/{family}/seed-{seed}"
            assert matched == [f"{folder}/{w}-{sharing}" for w in workflows for sharing in ("shared", "isolated")]
            assert all("--select majority " in line for line in best_of)
            others = [line for line in evaluated if "--best_of_calls" not in line]
            assert evaluations.index(best_of[0]) > max(map(evaluations.index, others))  # after what they read
    greedy = [line for line in evaluations if line.endswith("--max_completion_length 80 --temperature 0")]
    greedy += [line for line in evaluations if line.endswith("--max_completion_length 40 --temperature 0")]
    sampled = [line for line in evaluations if line.endswith("--k 4 --temperature 0.7 --checkpoints final")]
    assert len(greedy) == len(sampled) - 3 * 2 * 8 == (len(evaluations) - 3 * 2 * 8) // 2


def test_flags_given_beside_the_preset_win(capsys, tmp_path):
    grid_module = load_grid()
    args = grid_module.parse_args(["--preset", "toy", "--save_steps", "5", "--families", "arithmetic"])
    assert (args.save_steps, args.max_steps, args.models, args.families) == (5, 30, ["toy"], ["arithmetic"])
    assert args.output_root == "outputs/grid-toy" and args.seeds == []  # one seed, no seed-N folder
    launches, _ = dry_run(capsys, "--preset", "toy", "--families", "arithmetic", "--output_root", str(tmp_path))
    assert len(launches) == 7 and all(f"{tmp_path}/toy/arithmetic/" in line for line in launches)
    assert all("--seed 42 " in line for line in launches)
    with pytest.raises(ValueError, match="the presets are toy"):
        grid_module.parse_args(["--preset", "paper"])


def test_a_layered_recipe_config_is_evaluated_as_it_trains(capsys, tmp_path):
    """A --recipe_config that builds on a preset renders its evaluation prompts as the merged settings say: cpu.yaml
    takes the reference's rendering from paper_math.yaml, which it builds on; a user's file on cpu.yaml too."""
    mine = tmp_path / "mine.yaml"
    mine.write_text("base: cpu\nmax_steps: 2\n")
    reference = "--chat_rendering reference_qwen --chat_template_kwargs '{\"enable_thinking\": false}'"
    for config in ("recipes/configs/cpu.yaml", str(mine)):
        grid_args = ["--models", "m", "--tasks", "math", "--output_root", str(tmp_path)]
        launches, evaluations = dry_run(capsys, *grid_args, "--recipe_config", f"math={config}")
        assert all(f"--config {config} " in line for line in launches)
        assert evaluations and all(reference in line for line in evaluations)


def test_workflow_args_reach_that_workflows_trainings_only(capsys, tmp_path):
    weights = "--role_loss_weights '{\"aggregator\": 0.0}'"
    launches, _ = dry_run(
        capsys,
        "--preset",
        "toy",
        "--families",
        "arithmetic",
        "--workflows",
        "voting",
        "--output_root",
        str(tmp_path),
        "--recipe_args",
        "--logging_steps 2",
        "--workflow_args",
        f"voting={weights}",
    )
    voting = [line for line in launches if "recipes/voting_math.py" in line]
    single = [line for line in launches if "recipes/single_agent_math.py" in line]
    assert len(voting) == 2 and len(single) == 1
    assert all(line.endswith(f"--logging_steps 2 {weights}") for line in voting)  # after --recipe_args
    assert single[0].endswith("--logging_steps 2")  # SA-RL has no aggregator: trained without the weights
    grid_module = load_grid()
    for entries, match in (
        (["orch_workers=--x 1"], "not a workflow of this grid"),
        (["voting"], "takes workflow=value entries"),
    ):
        args = grid_module.parse_args(["--preset", "toy", "--workflows", "voting", "--workflow_args", *entries])
        with pytest.raises(ValueError, match=match):
            grid_module.train_command(args, grid_module.grid_cells(args)[0])


def test_without_seeds_and_families_the_grid_is_as_before(tmp_path):
    grid_module = load_grid()
    args = grid_module.parse_args(
        ["--models", "org/m", "--tasks", "math", "--workflows", "voting", "--output_root", str(tmp_path)]
    )
    cells = grid_module.grid_cells(args)
    assert [cell.run_dir for cell in cells] == [
        tmp_path / "m" / "math" / name for name in ("single_agent", "voting-shared", "voting-isolated")
    ]
    command = grid_module.train_command(args, cells[0])
    assert "--dataset_name" not in command and "--config" not in command  # the recipe's paper preset decides
    with pytest.raises(ValueError, match="neither a task"):
        grid_module.grid_cells(grid_module.parse_args(["--eval_dataset", "maths=arithmetic"]))


def test_mod_search_runs_on_a_model_of_its_own(capsys, tmp_path):
    grid_module = load_grid()
    cells = grid_module.grid_cells(
        grid_module.parse_args(["--preset", "toy", "--families", "arithmetic", "mod_search"])
    )
    assert {cell.family.name: cell.model for cell in cells} == {"arithmetic": "toy", "mod_search": "toy-search"}
    missing = tmp_path / "toy-search"
    with pytest.raises(FileNotFoundError, match=f"no model at {missing}"):
        grid_module.grid_cells(grid_module.parse_args(["--families", f"mod_search:model={missing}"]))
    missing.mkdir()
    (missing / "config.json").write_text("{}")
    launches, evaluations = dry_run(
        capsys,
        "--preset",
        "toy",
        "--families",
        "arithmetic",
        f"mod_search:model={missing}",
        "--output_root",
        str(tmp_path / "runs"),
    )
    search = [line for line in launches if "/mod_search/" in line]
    assert len(search) == len(launches) - 7 == 7  # arithmetic stays on --models (toy)
    assert all(f"--dataset_name mod_search --model_name_or_path {missing} " in line for line in search)
    assert all(f"{tmp_path}/runs/toy-search/mod_search/" in line for line in search)
    assert all("--dataset_name mod_search" in line for line in evaluations if "/mod_search/" in line)
    # one check per call is the family's budget (ONE_CHECK_TOKENS): in its training and, last so it wins, evaluations
    assert all(line.endswith("--max_completion_length 40") for line in search)
    assert not any("--max_completion_length 40" in line for line in launches if "/arithmetic/" in line)
    for line in evaluations:
        budgets = [word for word in line.split(" --")[1:] if word.startswith("max_completion_length ")]
        assert budgets[-1] == ("max_completion_length 40" if "/mod_search/" in line else "max_completion_length 80")
    wider = grid_module.grid_cells(
        grid_module.parse_args(["--families", f"mod_search:model={missing},max_completion_length=60"])
    )
    assert {cell.family.max_completion_length for cell in wider} == {60}
    with pytest.raises(ValueError, match="max_completion_length takes a number"):
        grid_module.grid_cells(grid_module.parse_args(["--families", "mod_search:max_completion_length=long"]))
    with pytest.raises(ValueError, match="give its task too"):
        grid_module.grid_cells(grid_module.parse_args(["--families", "mine:dataset=x.jsonl"]))


def write_rows(run_dir, rows):
    run_dir.mkdir(parents=True, exist_ok=True)
    with (run_dir / "eval_results.jsonl").open("a") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def test_report_with_seeds_writes_a_table_per_seed_and_the_family_table(capsys, tmp_path):
    grid_module = load_grid()
    common = dict(model="toy", dataset="arithmetic", k=1, temperature=0.0, top_p=1.0, num_problems=2)

    def result(mode, workflow, sharing, seed, solved, step=30):
        return {
            **common,
            "mode": mode,
            "workflow": workflow,
            "policy_sharing": sharing,
            "seed": seed,
            "step": step,
            "accuracy": sum(solved) / 2,
            "problem_solved": solved,
            "trained_workflow": workflow,
        }

    for seed, sa, voting in ((1, [0, 1], [1, 1]), (2, [0, 0], [1, 0])):
        folder = tmp_path / "toy" / "arithmetic" / f"seed-{seed}"
        write_rows(folder / "single_agent", [result("trained", "SingleAgent", "isolated", seed, sa)])
        write_rows(folder / "voting-isolated", [result("trained", "Voting", "isolated", seed, voting)])
    args = grid_module.parse_args(
        [
            "--preset",
            "toy",
            "--families",
            "arithmetic",
            "--workflows",
            "voting",
            "--policy_sharing",
            "isolated",
            "--seeds",
            "1",
            "2",
            "--output_root",
            str(tmp_path),
            "--report_only",
        ]
    )
    assert grid_module.main(args) == 0
    out = capsys.readouterr().out
    families = (tmp_path / "families.md").read_text()
    assert families in out and "arithmetic (math task, arithmetic) on toy: seed(s) 1, 2" in families
    # Voting: 100 and 50 (mean 75, sd 35.4); SA-RL: 50 and 0; pooled per problem [1, .5] - [0, .5] = +50
    assert "| Voting | isolated | 30 | 75.0 ± 35.4 | +50.0 [" in families
    assert "| SA-RL | - | 30 | 25.0 ± 35.4 | - | - |" in families
    table = (tmp_path / "table.md").read_text()
    assert table.startswith("## seed 1\n") and "## seed 2\n" in table
    assert "| toy | arithmetic | Voting | isolated | trained | 50.0 (30) |" in table.split("## seed 2")[1]
    assert set(json.loads((tmp_path / "table.json").read_text())) == {"1", "2"}


@pytest.mark.slow
def test_toy_preset_end_to_end_one_family_two_cells(tmp_path):
    out = grid(
        "--preset",
        "toy",
        "--families",
        "arithmetic",
        "--workflows",
        "eval_opt",
        "--policy_sharing",
        "isolated",
        "--seeds",
        "7",
        "--max_steps",
        "1",
        "--save_steps",
        "1",
        "--eval_samplings",
        "--temperature 0",
        "--eval_args",
        "--limit 4 --max_completion_length 80",
        "--output_root",
        str(tmp_path),
        timeout=900,
    )
    folder = tmp_path / "toy" / "arithmetic" / "seed-7"
    (row,) = [r for r in read_results(folder / "eval_opt-isolated") if r["mode"] == "trained"]  # beside base's
    assert (row["step"], row["seed"], row["temperature"], len(row["problem_solved"])) == (1, 7, 0.0, 4)
    (sa_rl,) = [r for r in read_results(folder / "single_agent") if r["mode"] == "trained"]
    families = json.loads((tmp_path / "families.json").read_text())
    (table,) = families.values()
    eval_opt = next(line for line in table["lines"] if line["label"] == "EvalOpt")["results"]["greedy"]
    residual = eval_opt["vs_single_agent"]
    assert residual["value"] == pytest.approx(row["accuracy"] - sa_rl["accuracy"]) and residual["seeds"] == [7]
    assert residual["low"] <= residual["value"] <= residual["high"]
    assert (tmp_path / "families.md").read_text() in out


def test_report_adds_the_cost_matched_line_from_the_best_of_rows(capsys, tmp_path):
    grid_module = load_grid()
    common = dict(model="toy", dataset="arithmetic", k=4, temperature=0.7, top_p=1.0, num_problems=2, seed=42)

    def result(workflow, solved, **extra):
        described = dict(mode="trained", workflow=workflow, policy_sharing="isolated", trained_workflow=workflow)
        return {**common, **described, "step": 30, "accuracy": sum(solved) / 8, "problem_solved": solved, **extra}

    folder = tmp_path / "toy" / "arithmetic"
    write_rows(folder / "eval_opt-isolated", [result("EvalOpt", [4, 4], mean_calls=2.6)])
    sa_rl = result("SingleAgent", [4, 0])
    write_rows(folder / "single_agent", [sa_rl, result("SingleAgent", [4, 2], best_of=3, select="majority")])
    args = grid_module.parse_args(
        [
            "--preset",
            "toy",
            "--families",
            "arithmetic",
            "--workflows",
            "eval_opt",
            "--policy_sharing",
            "isolated",
            "--output_root",
            str(tmp_path),
            "--report_only",
        ]
    )
    assert grid_module.main(args) == 0
    families = (tmp_path / "families.md").read_text()
    assert "| SA-RL best-of-3 (majority) | - | 30 | 75.0 | +25.0 [" in families
    (eval_opt,) = [line for line in families.splitlines() if line.startswith("| EvalOpt |")]
    assert eval_opt.startswith("| EvalOpt | isolated | 30 | 100.0 | +50.0 [") and eval_opt.endswith("] (n=3) |")
    assert "| - | +25.0 [" in eval_opt  # EvalOpt minus best-of-3: 100 - 75
    table = (tmp_path / "table.md").read_text()
    assert "| SingleAgent | isolated | trained (best of 3, majority) | 75.0 (30) |" in table
    assert "| SingleAgent | isolated | trained | 50.0 (30) |" in table  # SA-RL's own row stays

    (folder / "single_agent" / "eval_results.jsonl").write_text(json.dumps(sa_rl) + "\n")  # results of before
    assert grid_module.main(args) == 0
    assert "best-of" not in (tmp_path / "families.md").read_text()
