"""bench/time_to_accuracy.py (and its report module): time to accuracy of DDP and bitpush runs, on loopback.

One short run (2 workers, 20 steps of digits-cnn: DDP fp32, DDP + PowerSGD, CLAN onebit)
checks the records against their own curves: the target is DDP fp32's best minus the
tolerance, steps/wall to target are the first evaluation that meets it, the projection is
steps x step_ms (PowerSGD's plain all-reduce steps at fp32's step time) and the speedups are
the ratios of those. The analysis, the projection and the step-times file are also checked
on hand-made input.
"""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(REPO, "bench", "time_to_accuracy.py")

torch = pytest.importorskip("torch", reason="bench/time_to_accuracy.py needs torch")


def load_driver():
    spec = importlib.util.spec_from_file_location("time_to_accuracy", DRIVER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_report():
    load_driver()  # puts bench/ on the path
    import time_to_accuracy_report
    return time_to_accuracy_report


STEP_MS = {"ddp-fp32": 250.0, "ddp-powersgd": 40.0, "bitpush-clan-onebit": 30.0}


def test_digits_runs_reach_the_ddp_fp32_target_as_their_curves_say(tmp_path):
    dist = pytest.importorskip("torch.distributed", reason="this torch has no torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    pytest.importorskip("sklearn", reason="digits-cnn needs scikit-learn's digits")
    step_times = tmp_path / "step_ms.json"
    step_times.write_text(json.dumps(STEP_MS))
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, DRIVER, "--workers", "2", "--tasks", "digits-cnn",
                        "--runs", "ddp-fp32,ddp-powersgd,bitpush-clan-onebit", "--steps", "20",
                        "--eval-every", "digits-cnn=5", "--tolerance", "1.5", "--seeds", "3",
                        "--step-times", str(step_times), "--out", str(out)],
                       capture_output=True, text=True, timeout=240,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads((out / "seed-3" / "results.json").read_text())
    setup = doc["setup"]
    assert setup["workers"] == 2 and setup["seed"] == 3 and setup["torch"] == torch.__version__
    block = doc["tasks"]["digits-cnn"]
    runs = block["runs"]
    assert list(runs) == ["ddp-fp32", "bitpush-clan-onebit", "ddp-powersgd"]  # alternating
    assert block["steps"] == 20 and block["step_ms"] == STEP_MS

    for name, r in runs.items():
        steps = [s for s, _, _ in r["curve"]]
        walls = [w for _, w, _ in r["curve"]]
        assert steps == [0, 5, 10, 15, 20], name
        assert walls[0] == 0.0 and walls == sorted(walls) and walls[-1] > 0.0, name
        assert all(0.0 <= v <= 100.0 for _, _, v in r["curve"]), name
        assert r["final_metric"] == r["curve"][-1][2]
        assert r["steps"] == 20
    assert runs["ddp-powersgd"]["powersgd_start_iter"] == 2  # 10 % of 20, at least 2
    assert runs["ddp-powersgd"]["powersgd_rank"] == 4
    assert runs["bitpush-clan-onebit"]["error_feedback"] == "both"
    assert runs["bitpush-clan-onebit"]["bytes_pushed"] > 0
    # Twenty steps of AdamW take the CNN well above chance (10 %).
    assert runs["ddp-fp32"]["final_metric"] > 30.0

    target = block["target"]
    fp32_values = [v for _, _, v in runs["ddp-fp32"]["curve"]]
    assert target["ddp_fp32_best"] == max(fp32_values)
    assert target["value"] == max(fp32_values) - 1.5 and target["tolerance"] == 1.5
    for name, r in runs.items():
        hits = [(s, w) for s, w, v in r["curve"] if v >= target["value"]]
        first = hits[0] if hits else (None, None)
        assert (r["steps_to_target"], r["wall_s_to_target"]) == first, name
    assert runs["ddp-fp32"]["steps_to_target"] is not None  # its own best is within reach

    def projected(name, steps):
        if steps is None:
            return None
        if name == "ddp-powersgd":
            plain = min(steps, 2)
            return (plain * STEP_MS["ddp-fp32"] + (steps - plain) * STEP_MS[name]) / 1000.0
        return steps * STEP_MS[name] / 1000.0

    fp32, psgd = runs["ddp-fp32"], runs["ddp-powersgd"]
    for name, r in runs.items():
        assert r["step_ms"] == STEP_MS[name]
        assert r["projected_s_to_target"] == projected(name, r["steps_to_target"]), name
        assert r["projected_s_total"] == projected(name, 20), name
        for peer, suffix in ((fp32, "ddp_fp32"), (psgd, "ddp_powersgd")):
            for kind in ("wall", "projected"):
                mine, theirs = r[kind + "_s_to_target"], peer[kind + "_s_to_target"]
                want = None if mine is None or theirs is None else theirs / mine
                assert r["%s_speedup_vs_%s" % (kind, suffix)] == want, (name, kind, suffix)
    assert fp32["projected_speedup_vs_ddp_fp32"] == 1.0

    # --seeds: the summary over the one seed is that seed's figures.
    summary = json.loads((out / "summary.json").read_text())["tasks"]["digits-cnn"]
    assert summary["seeds"] == [3]
    for name, r in runs.items():
        row = summary["runs"][name]
        assert row["steps_to_target"] == [r["steps_to_target"]], name
        assert row["mean_projected_s_to_target"] == r["projected_s_to_target"], name
    for kind in ("wall", "projected"):
        png = (out / "seed-3" / ("digits-cnn-%s.png" % kind)).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
    for name in runs:
        assert "| %s |" % name in p.stdout


def test_a_lower_is_better_target_and_the_first_evaluation_that_meets_it():
    d, r = load_driver(), load_report()
    task = d.TASKS["charlm"]
    records = {
        "ddp-fp32": {"run": "ddp-fp32", "steps": 30,
                     "curve": [[0, 0.0, 5.5], [10, 1.0, 2.5], [20, 2.0, 2.30], [30, 3.0, 2.31]]},
        "bitpush-lans": {"run": "bitpush-lans", "steps": 30,
                         "curve": [[0, 0.0, 5.5], [10, 0.5, 2.33], [20, 1.0, 2.2],
                                   [30, 1.5, 2.25]]},
        "ddp-fp16": {"run": "ddp-fp16", "steps": 30,
                     "curve": [[0, 0.0, 5.5], [10, 1.0, float("nan")], [20, 2.0, 2.6],
                               [30, 3.0, 2.4]]},
    }
    target = r.analyse(task, records, {"ddp-fp32": 100.0, "bitpush-lans": 50.0})
    assert target["ddp_fp32_best"] == 2.30 and target["value"] == 2.30 + task.tolerance
    assert (records["ddp-fp32"]["steps_to_target"],
            records["ddp-fp32"]["wall_s_to_target"]) == (20, 2.0)
    assert (records["bitpush-lans"]["steps_to_target"],
            records["bitpush-lans"]["wall_s_to_target"]) == (20, 1.0)  # 2.33 misses 2.32
    assert records["ddp-fp16"]["steps_to_target"] is None
    assert records["ddp-fp16"]["best_metric"] == 2.4  # the NaN is no one's best
    assert records["bitpush-lans"]["wall_speedup_vs_ddp_fp32"] == 2.0
    assert records["bitpush-lans"]["projected_s_to_target"] == 1.0
    assert records["bitpush-lans"]["projected_speedup_vs_ddp_fp32"] == 2.0
    assert records["ddp-fp16"]["projected_s_to_target"] is None  # no step time, no target
    assert records["bitpush-lans"]["wall_speedup_vs_ddp_powersgd"] is None  # no such run


def test_powersgd_projection_takes_its_plain_steps_at_fp32_time():
    d = load_report()
    ms = {"ddp-fp32": 100.0, "ddp-powersgd": 10.0}
    assert d.projected_seconds("ddp-powersgd", 30, ms, 21) == (21 * 100.0 + 9 * 10.0) / 1000.0
    assert d.projected_seconds("ddp-powersgd", 15, ms, 21) == 15 * 100.0 / 1000.0
    assert d.projected_seconds("ddp-powersgd", 30, {"ddp-powersgd": 10.0}, 21) is None
    assert d.projected_seconds("ddp-fp32", 30, ms) == 3.0
    assert d.projected_seconds("bitpush-lans", 30, ms) is None


def test_step_times_file_is_checked_and_read_flat_or_per_task(tmp_path):
    d = load_report()
    f = tmp_path / "st.json"
    f.write_text(json.dumps({"ddp-fp32": 5400, "bitpush-clan-onebit": 520.5}))
    assert d.load_step_times(str(f), ["digits-cnn", "charlm"]) == {
        "digits-cnn": {"ddp-fp32": 5400.0, "bitpush-clan-onebit": 520.5},
        "charlm": {"ddp-fp32": 5400.0, "bitpush-clan-onebit": 520.5}}
    f.write_text(json.dumps({"charlm": {"ddp-fp16": 7.0}}))
    assert d.load_step_times(str(f), ["digits-cnn", "charlm"]) == {
        "digits-cnn": {}, "charlm": {"ddp-fp16": 7.0}}
    f.write_text(json.dumps({"ddp-fp64": 1.0}))
    with pytest.raises(ValueError, match="unknown run 'ddp-fp64'"):
        d.load_step_times(str(f), ["charlm"])
    f.write_text(json.dumps({"ddp-fp32": -3}))
    with pytest.raises(ValueError, match="'ddp-fp32' must be a positive number of ms"):
        d.load_step_times(str(f), ["charlm"])


def test_charlm_validation_shared_among_ranks_equals_the_examples_bit_for_bit():
    d = load_driver()
    world = 3
    data = d.CharData(torch, 0, 0, world)
    data.args.val_batches = 5  # 2 + 2 + 1 windows; fewer than the default 16 keeps it short
    sums = torch.zeros(5)

    def allreduce_sum(t):  # every rank's part, added to the others' as the all-reduce does
        sums.add_(t)
        return sums

    torch.manual_seed(0)
    model = data.ch.CharLM(data.args)
    parts = [d.CharData.evaluate_shared(data, model, r, world, allreduce_sum)
             for r in range(world)]
    assert parts[-1] == data.ch.validation_loss(model, data.val, data.args)
    # Before the last rank's part the sum lacks its windows (the check can fail).
    assert parts[0] != parts[-1]


def test_adamw_runs_take_ddps_optimizer_and_lr_and_their_methods_error_feedback():
    d = load_driver()
    _, _, train_digits = d.import_examples()
    a = d.parse_args(["--tasks", "digits-cnn"])
    task = d.TASKS["digits-cnn"]
    ddp = d.run_spec(task, "ddp-fp32", a, 50)
    for run, method, ef in (("bitpush-adamw-sdp4bit", "sdp4bit", "none"),
                            ("bitpush-adamw-onebit", "onebit", "both")):
        spec = d.run_spec(task, run, a, 50)
        assert (spec["optimizer"], spec["compression"]) == ("adamw", method)
        assert spec["optimizer"] == ddp["optimizer"] and spec["lr"] == ddp["lr"] == 0.02
        ex, _, _ = d.import_examples()
        assert ex.cluster_error_feedback(d.example_args(spec)) == ef, run
    # --ddp-lr moves DDP and the AdamW runs together; --lr still wins for one run.
    a = d.parse_args(["--tasks", "digits-cnn", "--ddp-lr", "0.005",
                      "--lr", "bitpush-adamw-onebit=0.001"])
    assert d.run_spec(task, "bitpush-adamw-sdp4bit", a, 50)["lr"] == 0.005
    assert d.run_spec(task, "bitpush-adamw-onebit", a, 50)["lr"] == 0.001
    # CLAN's own runs keep the examples' lr and CLAN's error feedback (SDP4Bit: none).
    clan = d.run_spec(task, "bitpush-clan-sdp4bit", a, 50)
    assert clan["lr"] == train_digits.DEFAULT_LR["clan"]
    ex, _, _ = d.import_examples()
    assert ex.cluster_error_feedback(d.example_args(clan)) == "none"
    onebit = d.run_spec(task, "bitpush-clan-onebit", a, 50)
    assert ex.cluster_error_feedback(d.example_args(onebit)) == "both"


def test_steps_and_eval_every_take_one_number_or_one_per_task():
    d = load_driver()
    defaults = {"digits-cnn": 210, "charlm": 300}
    assert d.per_task(None, "steps", defaults) == defaults
    assert d.per_task("40", "steps", defaults) == {"digits-cnn": 40, "charlm": 40}
    assert d.per_task("charlm=150", "steps", defaults) == {"digits-cnn": 210, "charlm": 150}
    with pytest.raises(ValueError, match="--steps: 'mnist' is not one of the tasks run"):
        d.per_task("mnist=3", "steps", defaults)
    with pytest.raises(ValueError, match="--eval-every: 'charlm=0' must be >= 1"):
        d.per_task("charlm=0", "eval-every", defaults)


def test_from_results_projects_a_finished_run_with_new_step_times(tmp_path, capsys):
    d = load_driver()
    curve = {"ddp-fp32": [[0, 0.0, 10.0], [10, 1.0, 90.0], [20, 2.0, 95.0]],
             "bitpush-clan-onebit": [[0, 0.0, 10.0], [10, 0.5, 94.6], [20, 1.0, 95.2]]}
    doc = {"setup": {"workers": 2},
           "tasks": {"digits-cnn": {"steps": 20, "eval_every": 10, "workers": 2,
                                    "target": {"tolerance": 0.5},
                                    "runs": {r: {"run": r, "steps": 20, "curve": c,
                                                 "optimizer": opt, "lr": 0.02,
                                                 "compression": comp,
                                                 "projected_s_to_target": 99.0}
                                             for (r, c), (opt, comp) in zip(
                                                 curve.items(),
                                                 [("adamw", None), ("clan", "onebit")])}}}}
    src = tmp_path / "results.json"
    src.write_text(json.dumps(doc))
    st = tmp_path / "st.json"
    st.write_text(json.dumps({"ddp-fp32": 300.0, "bitpush-clan-onebit": 25.0}))
    out = tmp_path / "again"
    assert d.main(["--from-results", str(src), "--step-times", str(st), "--out", str(out),
                   "--no-plots"]) == 0
    runs = json.loads((out / "results.json").read_text())["tasks"]["digits-cnn"]["runs"]
    assert runs["ddp-fp32"]["steps_to_target"] == 20  # target 94.5
    assert runs["bitpush-clan-onebit"]["steps_to_target"] == 10
    assert runs["ddp-fp32"]["projected_s_to_target"] == 6.0
    assert runs["bitpush-clan-onebit"]["projected_s_to_target"] == 0.25
    assert runs["bitpush-clan-onebit"]["projected_speedup_vs_ddp_fp32"] == 24.0
    assert runs["bitpush-clan-onebit"]["wall_speedup_vs_ddp_fp32"] == 4.0
    # Without step times the old projection goes.
    assert d.main(["--from-results", str(out / "results.json"), "--out", str(tmp_path / "x"),
                   "--no-plots"]) == 0
    again = json.loads((tmp_path / "x" / "results.json").read_text())["tasks"]["digits-cnn"]
    assert not any(k.startswith("projected") for r in again["runs"].values() for k in r)
    assert "| bitpush-clan-onebit |" in capsys.readouterr().out


def test_from_results_merges_the_tasks_of_several_files_and_refuses_a_task_twice(tmp_path):
    d = load_driver()
    run = {"run": "ddp-fp32", "steps": 10, "optimizer": "adamw", "lr": 0.01,
           "compression": None}
    files = []
    for task, curve in (("digits-cnn", [[0, 0.0, 10.0], [10, 1.0, 90.0]]),
                        ("charlm", [[0, 0.0, 5.5], [10, 2.0, 2.5]])):
        doc = {"setup": {"command": "run %s" % task},
               "tasks": {task: {"steps": 10, "workers": 2, "target": {"tolerance": 0.0},
                                "runs": {"ddp-fp32": dict(run, curve=curve)}}}}
        files.append(tmp_path / ("%s.json" % task))
        files[-1].write_text(json.dumps(doc))
    out = tmp_path / "merged"
    assert d.main(["--from-results", "%s,%s" % tuple(files), "--out", str(out),
                   "--no-plots"]) == 0
    merged = json.loads((out / "results.json").read_text())
    assert sorted(merged["tasks"]) == ["charlm", "digits-cnn"]
    assert [s["command"] for s in merged["setup"]["merged_setups"]] == ["run digits-cnn",
                                                                        "run charlm"]
    assert merged["tasks"]["charlm"]["target"]["value"] == 2.5
    assert merged["tasks"]["digits-cnn"]["runs"]["ddp-fp32"]["steps_to_target"] == 10
    assert d.main(["--from-results", "%s,%s" % (files[0], files[0]), "--out",
                   str(tmp_path / "twice"), "--no-plots"]) == 2


def test_summarise_averages_each_seed_against_its_own_target(tmp_path, capsys):
    d = load_driver()
    files = []
    # Seed 0: DDP fp32 peaks at 95 (target 94.5) at step 20, AdamW + SDP4Bit reaches 94.5 at
    # step 10. Seed 1: DDP peaks at 90 (target 89.5) at step 10, SDP4Bit gets there at step
    # 20; PowerSGD never does in seed 1, so it has no mean time.
    curves = {0: {"ddp-fp32": [[0, 0.0, 10.0], [10, 1.0, 90.0], [20, 2.0, 95.0]],
                  "ddp-powersgd": [[0, 0.0, 10.0], [10, 1.5, 94.0], [20, 3.0, 95.0]],
                  "bitpush-adamw-sdp4bit": [[0, 0.0, 10.0], [10, 0.5, 94.5], [20, 1.0, 96.0]]},
              1: {"ddp-fp32": [[0, 0.0, 10.0], [10, 1.0, 90.0], [20, 2.0, 88.0]],
                  "ddp-powersgd": [[0, 0.0, 10.0], [10, 1.5, 80.0], [20, 3.0, 85.0]],
                  "bitpush-adamw-sdp4bit": [[0, 0.0, 10.0], [10, 0.5, 70.0], [20, 1.5, 89.5]]}}
    for seed, runs in curves.items():
        doc = {"setup": {"seed": seed, "command": "seed %d" % seed},
               "tasks": {"digits-cnn": {"steps": 20, "workers": 2, "target": {"tolerance": 0.5},
                                        "runs": {r: {"run": r, "steps": 20, "curve": c,
                                                     "optimizer": "adamw", "lr": 0.02,
                                                     "compression": None
                                                     if r.startswith("ddp") else "sdp4bit",
                                                     "powersgd_start_iter": 2}
                                                 for r, c in runs.items()}}}}
        files.append(tmp_path / ("s%d.json" % seed))
        files[-1].write_text(json.dumps(doc))
    st = tmp_path / "st.json"
    st.write_text(json.dumps({"ddp-fp32": 400.0, "ddp-powersgd": 100.0,
                              "bitpush-adamw-sdp4bit": 50.0}))
    out = tmp_path / "sum"
    assert d.main(["--summarise", "%s,%s" % tuple(files), "--step-times", str(st),
                   "--out", str(out)]) == 0
    s = json.loads((out / "summary.json").read_text())["tasks"]["digits-cnn"]
    assert s["seeds"] == [0, 1]
    fp32, psgd, sdp = (s["runs"][r] for r in ("ddp-fp32", "ddp-powersgd",
                                              "bitpush-adamw-sdp4bit"))
    assert fp32["steps_to_target"] == [20, 10] and fp32["mean_steps_to_target"] == 15.0
    assert sdp["steps_to_target"] == [10, 20] and sdp["mean_steps_to_target"] == 15.0
    assert sdp["final_metric"] == [96.0, 89.5] and sdp["mean_final_metric"] == 92.75
    assert fp32["mean_projected_s_to_target"] == (8.0 + 4.0) / 2
    assert sdp["mean_projected_s_to_target"] == (0.5 + 1.0) / 2
    assert sdp["projected_speedup_vs_ddp_fp32"] == 6.0 / 0.75
    assert fp32["mean_wall_s_to_target"] == 1.5 and sdp["mean_wall_s_to_target"] == 1.0
    assert sdp["wall_speedup_vs_ddp_fp32"] == 1.5
    assert psgd["steps_to_target"] == [20, None] and psgd["seeds_reaching_target"] == 1
    assert psgd["mean_projected_s_to_target"] is None
    assert sdp["projected_speedup_vs_ddp_powersgd"] is None
    assert "| bitpush-adamw-sdp4bit | AdamW sdp4bit lr 0.02" in capsys.readouterr().out
    # The same seed twice is refused.
    assert d.main(["--summarise", "%s,%s" % (files[0], files[0]), "--out",
                   str(tmp_path / "twice")]) == 2
