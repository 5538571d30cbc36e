"""Non-finite gradients are never silent (docs/errors.md, "Non-finite values").

- compression.non_finite: error (the default): a NaN injected into one worker's gradient at
  step k fails that step on every worker with BitpushError naming a tensor, the worker it came
  from, the round and the step; the steps before it trained.
- compression.non_finite: skip: every worker skips exactly that step, and the run ends with
  parameters bit-identical to a run whose data never had that step (onebit with error feedback
  on workers and servers, so the residuals are part of what must match).

Run as a script (`python this_file.py MODE OUT`) it is one worker of a run."""

import json
import os
import subprocess
import sys
import tempfile

import pytest

STEPS = 6
BAD_STEP = 2  # rank 1's batch of this step holds a NaN


def _batches(rank):
    import torch

    gen = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(STEPS):
        x = torch.randn(8, 32, generator=gen)
        y = torch.randint(0, 4, (8,), generator=gen)
        out.append((x, y))
    return out


def _worker(mode, out):
    """mode: "error" (NaN at BAD_STEP), "skip" (the same, under non_finite: skip), "clean"
    (BAD_STEP's batch left out)."""
    import torch

    import bitpush.torch as bp

    bp.init()
    result = {"error": None, "steps_done": 0}
    try:
        rank = bp.rank()
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                    torch.nn.Linear(64, 4))
        opt = bp.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                      named_parameters=model.named_parameters())
        if mode == "error":
            # Adam over onebit is steered to sdp4bit by one line (docs/training.md); not with
            # sdp4bit. Built and detached: nothing is pushed.
            extra = torch.nn.Linear(2, 2)
            for spec in ("onebit", "sdp4bit"):
                o = bp.DistributedOptimizer(torch.optim.AdamW(extra.parameters()),
                                            named_parameters=[("adam.%s.%s" % (spec, n), p)
                                                              for n, p in extra.named_parameters()],
                                            compression=spec)
                o.remove_hooks()
        for step, (x, y) in enumerate(_batches(rank)):
            if step == BAD_STEP:
                if mode == "clean":
                    continue
                if rank == 1:
                    x = x.clone()
                    x[3, 5] = float("nan")
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            try:
                opt.step()
            except bp.BitpushError as e:
                result["error"] = {"step": step, "code": e.code, "message": str(e)}
                break
            result["steps_done"] += 1
        result["skipped"] = opt.steps_skipped
        result["params"] = {n: p.detach().flatten().tolist() for n, p in model.named_parameters()}
        result["stats"] = {k: bp.stats()[k] for k in ("non_finite_pushes", "non_finite_rounds")}
    finally:
        with open(out, "w") as f:
            json.dump(result, f)
        if result["error"] is None:
            bp.shutdown()
        else:
            os._exit(0)  # the job failed: the other workers' rounds may never complete


def _run(mode, non_finite, tmp):
    testing = pytest.importorskip("bitpush.testing")
    extra = {"compression": {"non_finite": non_finite}} if non_finite else None
    with testing.LocalCluster(workers=2, servers=2, compression="onebit", error_feedback="both",
                              min_compress_bytes=1024, extra=extra) as cluster:
        procs, outs = [], []
        for rank in range(2):
            env = dict(os.environ)
            env.update({k: str(v) for k, v in cluster.env(rank).items()})
            outs.append(os.path.join(tmp, "%s-%s-rank%d.json" % (mode, non_finite, rank)))
            procs.append(subprocess.Popen([sys.executable, __file__, mode, outs[-1]], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                          text=True))
        logs = [p.communicate(timeout=120)[0] for p in procs]
        assert all(p.returncode == 0 for p in procs), logs
    results = []
    for out in outs:
        with open(out) as f:
            results.append(json.load(f))
    return results, logs


def test_a_nan_in_one_workers_gradient_fails_that_step_everywhere_naming_it():
    pytest.importorskip("bitpush.torch")
    results, logs = _run("error", None, tempfile.mkdtemp(prefix="bitpush-nonfinite-"))
    for rank, res in enumerate(results):
        err = res["error"]
        assert err is not None, (rank, res, logs)
        assert err["step"] == BAD_STEP and res["steps_done"] == BAD_STEP
        assert err["code"] == "OutOfRange"
        m = err["message"]
        assert "non-finite values (NaN or inf) in tensor '" in m, m
        assert "worker 1's gradient" in m, m
        assert "round %d)" % BAD_STEP in m, m
        assert "step %d counting from 0" % BAD_STEP in m, m
        assert res["stats"]["non_finite_rounds"] >= 1
    assert results[1]["stats"]["non_finite_pushes"] >= 1
    assert results[0]["stats"]["non_finite_pushes"] == 0
    for log in logs:
        assert log.count("DistributedOptimizer(AdamW) with onebit trails uncompressed AdamW") == 1



def test_skip_drops_exactly_that_step_on_every_worker_bit_for_bit():
    pytest.importorskip("bitpush.torch")
    tmp = tempfile.mkdtemp(prefix="bitpush-nonfinite-")
    skipped, logs = _run("skip", "skip", tmp)
    clean, _ = _run("clean", "skip", tmp)
    for rank in range(2):
        assert skipped[rank]["error"] is None, (skipped[rank], logs)
        assert skipped[rank]["skipped"] == 1 and clean[rank]["skipped"] == 0
        assert skipped[rank]["steps_done"] == STEPS and clean[rank]["steps_done"] == STEPS - 1
        # Nothing reached the engine: the check runs before any push.
        assert skipped[rank]["stats"] == {"non_finite_pushes": 0, "non_finite_rounds": 0}
        assert skipped[rank]["params"] == clean[rank]["params"]
    assert skipped[0]["params"] == skipped[1]["params"]
    # The NaN in rank 1's input reaches all 4 of its gradients; rank 0's are finite.
    assert "skipped a step (1 so far): 4 non-finite gradient(s) over the workers" in logs[0]
    assert "here:" not in logs[0]
    assert "here: '0.weight', '0.bias', '2.weight'" in logs[1], logs[1]


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2])
