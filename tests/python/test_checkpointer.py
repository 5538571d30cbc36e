"""bitpush.torch.Checkpointer (python/bitpush/torch/checkpointer.py, docs/training.md
"Checkpointer"), on a real 2-worker cluster: a fresh job writes the step-0 checkpoint, periodic
ones keep the newest `keep` complete, a directory without COMPLETE (a save a death interrupted)
is never loaded and is removed at the next save, state objects (an lr scheduler) come back,
and a resumed run ends bit-identical to an uninterrupted one; bad arguments are refused by
name. The chaos test (test_chaos.py) covers restarts under the launcher.
"""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
testing = pytest.importorskip("bitpush.testing")

SCRIPT = r"""
import json, os, sys, time
import torch
import bitpush.torch as bp

directory, total, first_stop, mode, out = sys.argv[1:6]
total, first_stop = int(total), int(first_stop)
bp.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 2))
named = [("m." + n, p) for n, p in model.named_parameters()]
opt = bp.CLAN([p for _, p in named], lr=0.05, named_parameters=named)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))
res = {}
ckpt = None
if mode == "seconds":
    ckpt = bp.Checkpointer(directory, model, opt, every_seconds=0.05, keep=100)
    step = ckpt.resume()
elif mode != "plain":
    ckpt = bp.Checkpointer(directory, model, opt, every_steps=3, keep=2, state={"lr": sched})
    step = ckpt.resume()
    res["resumed_at"] = step
    res["lr_at_resume"] = opt.param_groups[0]["lr"]
else:
    step = 0
stop = first_stop if mode == "first" else total
while step < stop:
    g = torch.Generator().manual_seed(100 * step + bp.rank())
    x, y = torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)
    opt.zero_grad()
    ((model(x) - y) ** 2).mean().backward()
    opt.step()
    sched.step()
    step += 1
    if mode == "seconds":
        time.sleep(0.02)
    if ckpt is not None:
        ckpt.step(step)
if ckpt is not None and mode == "first" and bp.rank() == 0:
    res["dirs"] = sorted(os.listdir(directory))
    # A save a death interrupted: files without COMPLETE, newer than every complete one.
    os.makedirs(os.path.join(directory, "step-00000099"))
    with open(os.path.join(directory, "step-00000099", "job.pt"), "w") as f:
        f.write("half a file")
bp.barrier()
res["params"] = [p.detach().tolist() for p in model.parameters()]
res["lr"] = opt.param_groups[0]["lr"]
if ckpt is not None and bp.rank() == 0:
    res["dirs_at_end"] = sorted(os.listdir(directory))
opt.remove_hooks()
with open(out, "w") as f:
    json.dump(res, f)
bp.shutdown()
"""


def _run(tmp_path, mode, total=10, first_stop=7):
    outs = [str(tmp_path / ("%s-%d.json" % (mode, r))) for r in range(2)]
    with testing.LocalCluster(workers=2, servers=2, compression="onebit",
                              error_feedback="both", min_compress_bytes=64) as cluster:
        procs = []
        for r in range(2):
            env = dict(os.environ)
            env.update({k: str(v) for k, v in cluster.env(r).items()})
            procs.append(subprocess.Popen(
                [sys.executable, "-c", SCRIPT, str(tmp_path / "ckpt"), str(total),
                 str(first_stop), mode, outs[r]], env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, universal_newlines=True))
        logs = [p.communicate(timeout=120)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), logs
    return [json.load(open(o)) for o in outs], logs


def test_periodic_checkpoints_resume_bit_identical_and_skip_an_interrupted_save(tmp_path):
    plain, _ = _run(tmp_path, "plain")
    first, _ = _run(tmp_path, "first")
    assert first[0]["resumed_at"] == 0
    # Steps 0 (fresh job), 3, 6 written; keep=2 leaves 3 and 6.
    assert first[0]["dirs"] == ["step-00000003", "step-00000006"], first[0]
    resumed, logs = _run(tmp_path, "resume")
    for r in range(2):
        # The interrupted step-99 is not loaded: the newest complete one is step 6.
        assert resumed[r]["resumed_at"] == 6, resumed[r]
        # The scheduler's state came back: lr = 0.05 / (1 + 6).
        assert resumed[r]["lr_at_resume"] == pytest.approx(0.05 / 7), resumed[r]
        assert resumed[r]["params"] == plain[r]["params"], r
        assert resumed[r]["lr"] == plain[r]["lr"]
    assert "bitpush: resumed from %s (step 6, restart 0)" % (tmp_path / "ckpt" / "step-00000006") \
        in logs[0], logs[0]
    # Step 9 was saved; the interrupted step-99 and the oldest complete one were removed.
    assert resumed[0]["dirs_at_end"] == ["step-00000006", "step-00000009"], resumed[0]


def test_every_seconds_follows_rank_0s_clock(tmp_path):
    # 10 steps of >= 20 ms with a checkpoint due every 50 ms: rank 0 decides, every process
    # saves at the same steps (or the collective save would not complete).
    out, _ = _run(tmp_path, "seconds")
    dirs = out[0]["dirs_at_end"]
    assert dirs[0] == "step-00000000" and 3 <= len(dirs) <= 7, dirs
    for d in dirs:
        assert os.path.exists(tmp_path / "ckpt" / d / "COMPLETE"), d
    assert out[0]["params"] == out[1]["params"]  # both finished, in step


def test_bad_arguments_are_refused_by_name():
    import bitpush.torch as bp

    with pytest.raises(ValueError, match="give every_steps or every_seconds"):
        bp.Checkpointer("d")
    with pytest.raises(ValueError, match="every_steps must be a positive integer, got 0"):
        bp.Checkpointer("d", every_steps=0)
    with pytest.raises(ValueError, match="every_seconds must be > 0, got -1"):
        bp.Checkpointer("d", every_seconds=-1)
    with pytest.raises(ValueError, match="keep must be at least 1, got 0"):
        bp.Checkpointer("d", every_steps=5, keep=0)
