"""The analysis and report of bench/time_to_accuracy.py: a task's target from DDP fp32's
curve, each run's steps and time to it, the projection from per-step times, the speedups,
the markdown table and the plots (docs/time-to-accuracy.md).

Pure functions over the runs' records ({run: {"curve": [[step, wall_s, metric], ...], ...}});
no torch, no processes. The driver and `time_to_accuracy.py --from-results` call them; the
records are mutated in place (analyse adds the figures).
"""
import json
import math
import os

# Every run, in the order one invocation alternates them (DDP, bitpush, DDP, ...).
RUN_ORDER = ("ddp-fp32", "bitpush-lans", "ddp-fp16", "bitpush-clan-onebit", "ddp-powersgd",
             "bitpush-clan-sdp4bit", "bitpush-clan-loco", "bitpush-binsgdm",
             "bitpush-adamw-sdp4bit", "bitpush-adamw-onebit")
DDP_VARIANTS = {"ddp-fp32": "fp32", "ddp-fp16": "fp16", "ddp-powersgd": "powersgd"}


class Task:
    """What a task is: its default length, the DDP optimizer, the metric and its tolerance.
    The data and model live in the rank process (rank_task)."""

    def __init__(self, name, steps, eval_every, metric, higher_is_better, tolerance,
                 ddp_optimizer, ddp_lr, example, unit):
        self.name = name
        self.steps = steps
        self.eval_every = eval_every
        self.metric = metric
        self.higher_is_better = higher_is_better
        self.tolerance = tolerance
        self.ddp_optimizer = ddp_optimizer
        self.ddp_lr = ddp_lr
        self.example = example  # the module whose DEFAULT_LR the bitpush runs take
        self.unit = unit

    def meets(self, value, target):
        if value is None or target is None or math.isnan(value):
            return False
        return value >= target if self.higher_is_better else value <= target

    def target_from(self, values):
        """DDP fp32's best evaluation, relaxed by the tolerance."""
        good = [v for v in values if v is not None and not math.isnan(v)]
        if not good:
            return None, None
        best = max(good) if self.higher_is_better else min(good)
        return best, best - self.tolerance if self.higher_is_better else best + self.tolerance


# -- analysis ---------------------------------------------------------------------------------


def first_at_target(task, curve, target):
    """(step, wall_s) of the first evaluation that meets the target, else (None, None)."""
    for step, wall, value in curve:
        if task.meets(value, target):
            return step, wall
    return None, None


def projected_seconds(run, steps, step_ms, powersgd_start_iter=None):
    """The projected time of `steps` steps of `run` at the step times `step_ms` ({run: ms}),
    in seconds, or None when a step time it needs is missing. ddp-powersgd's first
    powersgd_start_iter steps are plain all-reduces: they take ddp-fp32's step time."""
    if steps is None or run not in step_ms:
        return None
    if run == "ddp-powersgd" and powersgd_start_iter:
        if "ddp-fp32" not in step_ms:
            return None
        plain = min(steps, powersgd_start_iter)
        return (plain * step_ms["ddp-fp32"] + (steps - plain) * step_ms[run]) / 1000.0
    return steps * step_ms[run] / 1000.0


def speedup(base, mine):
    if base is None or mine is None or mine <= 0:
        return None
    return base / mine


def analyse(task, records, step_ms):
    """Adds the target and every run's figures to `records` ({run: record with "curve"});
    returns the task's target block."""
    fp32 = records.get("ddp-fp32")
    best, target = task.target_from([v for _, _, v in fp32["curve"]]) if fp32 else (None, None)
    for run, rec in records.items():
        values = [v for _, _, v in rec["curve"]]
        good = [v for v in values if not math.isnan(v)]
        rec["final_metric"] = values[-1] if values else None
        rec["best_metric"] = (max(good) if task.higher_is_better else min(good)) if good else None
        rec["steps_to_target"], rec["wall_s_to_target"] = first_at_target(task, rec["curve"],
                                                                          target)
        if step_ms is not None:
            rec["step_ms"] = step_ms.get(run)
            rec["projected_s_to_target"] = projected_seconds(
                run, rec["steps_to_target"], step_ms, rec.get("powersgd_start_iter"))
            rec["projected_s_total"] = projected_seconds(run, rec["steps"], step_ms,
                                                         rec.get("powersgd_start_iter"))
    for run, rec in records.items():
        for peer in ("ddp-fp32", "ddp-powersgd"):
            suffix = peer.replace("-", "_")
            other = records.get(peer)
            rec["wall_speedup_vs_" + suffix] = speedup(
                other and other["wall_s_to_target"], rec["wall_s_to_target"])
            if step_ms is not None:
                rec["projected_speedup_vs_" + suffix] = speedup(
                    other and other["projected_s_to_target"], rec["projected_s_to_target"])
    return {"metric": task.metric, "unit": task.unit, "higher_is_better": task.higher_is_better,
            "ddp_fp32_best": best, "tolerance": task.tolerance, "value": target,
            "definition": "ddp-fp32's best evaluation %s %g %s" % (
                "minus" if task.higher_is_better else "plus", task.tolerance, task.unit)}


def mean(values):
    """The mean of `values`, or None when any is None (a seed that never reached the target
    leaves the run without a mean time to it) or there are none."""
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)


def summarise_seeds(blocks):
    """One task's runs over several seeds: `blocks` maps seed -> that seed's analysed block
    (analyse() already ran: each seed has its own target, DDP fp32's best of that seed).
    Per run, the per-seed figures, their means (None where a seed missed the target) and the
    speedups of the mean times against DDP fp32's and DDP + PowerSGD's mean times."""
    seeds = sorted(blocks)
    runs = [r for r in RUN_ORDER if all(r in blocks[s]["runs"] for s in seeds)]
    out = {}
    for run in runs:
        recs = [blocks[s]["runs"][run] for s in seeds]
        row = {"seeds": seeds,
               "steps_to_target": [r["steps_to_target"] for r in recs],
               "final_metric": [r["final_metric"] for r in recs],
               "seeds_reaching_target": sum(r["steps_to_target"] is not None for r in recs)}
        for key in ("steps_to_target", "final_metric", "wall_s_to_target",
                    "projected_s_to_target"):
            row["mean_" + key] = mean([r.get(key) for r in recs])
        row["describe"] = describe_run(recs[0])
        row["step_ms"] = recs[0].get("step_ms")
        out[run] = row
    for run, row in out.items():
        for peer in ("ddp-fp32", "ddp-powersgd"):
            suffix = peer.replace("-", "_")
            other = out.get(peer)
            for kind in ("wall", "projected"):
                row["%s_speedup_vs_%s" % (kind, suffix)] = speedup(
                    other and other["mean_%s_s_to_target" % kind],
                    row["mean_%s_s_to_target" % kind])
    return {"seeds": seeds, "runs": out}


def summary_table(task_name, summary):
    """The markdown table of summarise_seeds' result."""
    seeds = summary["seeds"]
    head = ["run", "recipe", "steps to target (seeds %s)" % ", ".join(map(str, seeds)),
            "mean steps", "mean final", "mean wall s to target", "wall × vs fp32",
            "step ms", "mean projected s", "proj. × vs fp32", "proj. × vs PowerSGD"]
    lines = ["### %s: %d seeds, each against its own ddp-fp32 target" % (task_name, len(seeds)),
             "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run, r in summary["runs"].items():
        row = [run, r["describe"], " / ".join(fmt(x, "%d") for x in r["steps_to_target"]),
               fmt(r["mean_steps_to_target"], "%.1f"), fmt(r["mean_final_metric"], "%.3f"),
               fmt(r["mean_wall_s_to_target"], "%.1f"), fmt(r["wall_speedup_vs_ddp_fp32"]),
               fmt(r["step_ms"], "%.1f"), fmt(r["mean_projected_s_to_target"], "%.1f"),
               fmt(r["projected_speedup_vs_ddp_fp32"]),
               fmt(r["projected_speedup_vs_ddp_powersgd"])]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def load_step_times(path, tasks):
    """{task: {run: step_ms}} from a flat {run: ms} (every task) or {task: {run: ms}}."""
    with open(path) as f:
        doc = json.load(f)
    if not isinstance(doc, dict):
        raise ValueError("%s: expected a JSON object {run: step_ms} or {task: {run: step_ms}}"
                         % path)
    nested = any(isinstance(v, dict) for v in doc.values())
    out = {}
    for t in tasks:
        table = doc.get(t, {}) if nested else doc
        for run, ms in table.items():
            if run not in RUN_ORDER:
                raise ValueError("%s: unknown run %r (runs: %s)" % (path, run,
                                                                    ", ".join(RUN_ORDER)))
            if not isinstance(ms, (int, float)) or isinstance(ms, bool) or ms <= 0:
                raise ValueError("%s: step time of %r must be a positive number of ms, not %r"
                                 % (path, run, ms))
        out[t] = {k: float(v) for k, v in table.items()}
    return out


# -- output -----------------------------------------------------------------------------------


def fmt(v, spec="%.2f"):
    return "—" if v is None else spec % v


def describe_run(rec):
    if rec["run"] in DDP_VARIANTS:
        hook = {"fp32": "no hook", "fp16": "fp16_compress_hook",
                "powersgd": "powerSGD_hook%s from step %s" % (
                    " r=%d" % rec["powersgd_rank"] if "powersgd_rank" in rec else "",
                    rec.get("powersgd_start_iter"))}[DDP_VARIANTS[rec["run"]]]
        return "%s lr %g, %s" % ({"adamw": "AdamW", "sgd": "SGD m=0.9"}[rec["optimizer"]],
                                 rec["lr"], hook)
    name = {"lans": "LANS", "clan": "CLAN", "binsgdm": "BinSGDM",
            "adamw": "AdamW"}[rec["optimizer"]]
    comp = "" if rec["optimizer"] in ("lans", "binsgdm") else " " + rec["compression"]
    return "%s%s lr %g, EF %s" % (name, comp, rec["lr"], rec.get("error_feedback", "none"))


def table(task_name, block):
    t = block["target"]
    lines = ["### %s: target %s %s (%s)" % (task_name, fmt(t["value"], "%.4g"), t["unit"],
                                           t["definition"]), ""]
    projected = any("projected_s_to_target" in r for r in block["runs"].values())
    head = ["run", "recipe", "final", "steps to target", "wall s to target",
            "wall × vs fp32", "wall × vs PowerSGD", "wall s, all steps"]
    if projected:
        head += ["step ms", "projected s to target", "proj. × vs fp32", "proj. × vs PowerSGD"]
    lines.append("| " + " | ".join(head) + " |")
    lines.append("|" + "---|" * len(head))
    for run, r in block["runs"].items():
        row = [run, describe_run(r), fmt(r["final_metric"], "%.3f"),
               fmt(r["steps_to_target"], "%d"), fmt(r["wall_s_to_target"], "%.1f"),
               fmt(r["wall_speedup_vs_ddp_fp32"]), fmt(r["wall_speedup_vs_ddp_powersgd"]),
               fmt(r.get("train_s"), "%.1f")]
        if projected:
            row += [fmt(r.get("step_ms"), "%.1f"), fmt(r.get("projected_s_to_target"), "%.1f"),
                    fmt(r.get("projected_speedup_vs_ddp_fp32")),
                    fmt(r.get("projected_speedup_vs_ddp_powersgd"))]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot(task_name, block, out_dir, step_ms):
    """<task>-wall.png and, with step times, <task>-projected.png; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = block["target"]
    paths = []
    kinds = [("wall", "real wall time on this machine (s)")]
    if step_ms is not None:
        kinds.append(("projected", "projected time from the step times (s)"))
    for kind, xlabel in kinds:
        fig, ax = plt.subplots(figsize=(8, 5))
        for run, r in block["runs"].items():
            if kind == "wall":
                xs = [w for _, w, _ in r["curve"]]
            else:
                xs = [projected_seconds(run, s, step_ms, r.get("powersgd_start_iter"))
                      for s, _, _ in r["curve"]]
                if any(x is None for x in xs):
                    continue
            ax.plot(xs, [v for _, _, v in r["curve"]], marker=".",
                    linestyle="--" if run.startswith("ddp") else "-", label=run)
        if t["value"] is not None:
            ax.axhline(t["value"], color="grey", linewidth=0.8, linestyle=":",
                       label="target %.4g" % t["value"])
        ax.set_xlabel(xlabel)
        ax.set_ylabel("%s (%s)" % (t["metric"], t["unit"]))
        ax.set_title("%s, %d workers" % (task_name, block["workers"]))
        if t["higher_is_better"] and t["value"] is not None:
            ax.set_ylim(max(0.0, t["value"] - 25), 100.5)
        elif t["value"] is not None:
            ax.set_ylim(t["value"] - 0.3, t["value"] + 1.5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        path = os.path.join(out_dir, "%s-%s.png" % (task_name, kind))
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def write_json(path, doc):
    """Writes aside, then renames: a reader never sees half a file."""
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    os.replace(path + ".tmp", path)
