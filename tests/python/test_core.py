"""bitpush.torch core on real processes over loopback (bitpush.testing.LocalCluster):
scheduler + 2 servers + 2 worker processes (/usr/bin/python3, embedded mode).

One cluster run (`core_run`, module scope) exercises the API end to end and returns what each
worker saw; the tests below check it piece by piece. Separate clusters: a declaration that
differs between the workers, a server killed mid-training. In-process: init errors.
"""
import signal
import threading
import time

import pytest
import torch

import bitpush
import bitpush.torch as bp

WORKERS = 2
HEARTBEAT_TIMEOUT_MS = 1000


def _inputs(rank, n, seed):
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return torch.randn(n, generator=g)


def onebit(x):
    """compressors/onebit (scaled): mean |x| times the sign, +scale for x >= 0 (float64)."""
    x = x.double()
    return torch.where(x < 0, -1.0, 1.0).double() * x.abs().mean()


# -------------------------------------------------------------------------------------------
# Worker side of the main run (runs in each worker process).

def core_worker():
    out = {}
    bp.init()
    r = bp.rank()
    out["ids"] = (bp.rank(), bp.size(), bp.local_rank(), bp.local_size(), bp.node_rank(),
                  bp.num_nodes(), bp.mode(), bp.is_initialized())

    # fp32 / fp16, average and sum, compression none: exact.
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4) * (r + 1)
    out["avg32"] = bp.push_pull(x, "avg32")
    out["sum32"] = bp.push_pull(x, "sum32", average=False)
    h16 = (torch.arange(8, dtype=torch.float16) * (r + 1)) / 4
    out["avg16"] = bp.push_pull(h16, "avg16")
    b16 = (torch.arange(8, dtype=torch.bfloat16) * (r + 1)) / 4
    out["avgbf16"] = bp.push_pull(b16, "avgbf16")
    inplace = torch.full((5,), float(r + 1))
    res = bp.push_pull_inplace(inplace, "inplace")
    out["inplace"] = (res.data_ptr() == inplace.data_ptr(), inplace.clone())
    # A second round of the same name: same declaration, new values.
    out["avg32_round2"] = bp.push_pull(x * 2, "avg32")

    # onebit (per-tensor spec; the cluster default is none).
    big = _inputs(r, 1000, 7)
    out["onebit_in"] = big
    out["onebit"] = bp.push_pull(big, "onebit.t", compression="onebit")
    out["onebit16"] = bp.push_pull(big.half(), "onebit.h", compression="onebit")

    # Async overlap: start several, complete in reverse order.
    tensors = [torch.full((1000 * (i + 1),), float(r + i)) for i in range(5)]
    handles = [bp.push_pull_async(t, "async.%d" % i, priority=i) for i, t in enumerate(tensors)]
    outputs = [bp.synchronize(h) for h in reversed(handles)][::-1]
    out["async"] = [o[:3].clone() for o in outputs]
    out["async_polled"] = all(bp.poll(h) for h in handles)
    pre = torch.ones(4) * r
    explicit_out = torch.empty(4)
    got = bp.synchronize(bp.push_pull_async(pre, "async.out", output=explicit_out))
    out["async_out"] = (got is explicit_out, explicit_out.clone())

    # Errors caught locally.
    errors = {}
    try:
        bp.push_pull(torch.zeros(4, 4).t(), "noncontig")
    except ValueError as e:
        errors["noncontig"] = str(e)
    try:
        bp.push_pull(torch.zeros(4, dtype=torch.float64), "f64")
    except TypeError as e:
        errors["dtype"] = str(e)
    try:
        bp.push_pull(torch.empty(4, device="meta"), "offcpu")
    except ValueError as e:
        errors["device"] = str(e)
    try:
        bp.push_pull(torch.zeros(13), "avg32")  # declared with 12 elements
    except bitpush.BitpushError as e:
        errors["redeclare"] = (e.code, str(e))
    out["errors"] = errors

    # broadcast_parameters: rank 1 starts with other values.
    torch.manual_seed(100 + r)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    model[1].num_batches_tracked += 5 + r
    bp.broadcast_parameters(model.state_dict(), root_rank=0)
    out["model"] = {k: v.clone() for k, v in model.state_dict().items()}

    # broadcast_optimizer_state: after one step with rank-specific gradients and lr.
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * (r + 1), momentum=0.9)
    for p in model.parameters():
        p.grad = torch.full_like(p, float(r + 1))
    opt.step()
    bp.broadcast_optimizer_state(opt, root_rank=0)
    out["opt"] = (opt.param_groups[0]["lr"],
                  [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()])

    # Ctrl-C during a wait: rank 0 waits for a round rank 1 starts only 1.5 s later.
    t = torch.ones(3) * (r + 1)
    bp.push_pull(t, "late")
    if r == 0:
        h = bp.push_pull_async(t, "late")

        def on_alarm(signum, frame):
            raise KeyboardInterrupt

        old = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        start = time.monotonic()
        try:
            h.wait()
            out["interrupted"] = None
        except KeyboardInterrupt:
            out["interrupted"] = time.monotonic() - start
        finally:
            signal.signal(signal.SIGALRM, old)
        out["late"] = bp.synchronize(h).clone()  # the operation went on
    else:
        time.sleep(1.5)
        out["late"] = bp.push_pull(t, "late")

    # Horovod-style: allreduce without a name, from one line in a loop (one tensor, reused),
    # op=Sum, the Compression namespace.
    out["noname"] = [bp.allreduce(torch.full((5,), float(r + k))) for k in range(3)]
    out["noname_sum"] = bp.allreduce(torch.full((2,), float(r + 1)), op=bp.Sum)
    out["noname_fp16"] = bp.push_pull(torch.full((4,), float(r + 1)),
                                      compression=bp.Compression.fp16)
    out["noname_report"] = bp.compression_report(
        [n for n in bp._require().declarations if n.startswith("noname.")])

    # A push_pull that waits for its tensor to be ready (a CUDA event on a GPU; a gate here)
    # returns at once and starts on the starter thread once the tensor is ready.
    class Gate:
        def __init__(self):
            self.open = threading.Event()

        def synchronize(self):
            self.open.wait(30)

    gate = Gate()
    h = bp.push_pull_async(torch.full((6,), float(r + 1)), "deferred", _ready=gate)
    time.sleep(0.2)
    out["deferred_pending"] = not h.ready()
    gate.open.set()
    out["deferred"] = bp.synchronize(h).clone()

    s = bp.stats()
    out["stats"] = s
    bp.shutdown()
    out["after_shutdown"] = bp.is_initialized()
    return out


@pytest.fixture(scope="module")
def core_run():
    with bitpush.testing.LocalCluster(workers=WORKERS, servers=2,
                                      heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS) as c:
        results = c.run_workers(core_worker, timeout=90)
        assert all(r.ok for r in results), c.describe(results)
        exits = c.wait_exit(10)
        assert all(rc == 0 for rc in exits.values()), (exits, c.describe(results))
        return [r.value for r in results]


def test_ranks_and_sizes(core_run):
    for r, out in enumerate(core_run):
        assert out["ids"] == (r, 2, 0, 1, r, 2, "embedded", True)
        assert out["after_shutdown"] is False


def test_horovod_style_allreduce_needs_no_name_and_reuses_one_tensor_per_line(core_run):
    for out in core_run:
        # ranks 0 and 1 push r + k: the average is k + 0.5; the loop's 3 calls are 1 tensor.
        assert [t.tolist() for t in out["noname"]] == [[k + 0.5] * 5 for k in range(3)]
        assert out["noname_sum"].tolist() == [3.0, 3.0]
        assert out["noname_fp16"].tolist() == [1.5] * 4
        # 3 call sites: the loop's line, the op=Sum line and the push_pull line.
        assert "of 3 tensors" in out["noname_report"], out["noname_report"]
        assert "fp16 on 1" in out["noname_report"], out["noname_report"]


def test_a_push_pull_waiting_for_its_tensor_starts_once_it_is_ready(core_run):
    for out in core_run:
        assert out["deferred_pending"] is True
        assert out["deferred"].tolist() == [1.5] * 6


def cuda_overlap_worker():
    bp.init()
    r = bp.rank()
    x = torch.full((1000,), float(r + 1), device="cuda")
    # A first round: the declaration's check and the first pinned staging buffer (whose
    # allocation waits for the device) are behind us; the hook path is measured in steady state.
    bp.synchronize(bp.push_pull_async(x * 0, "gpu.g"))
    # About a second of GPU work queued on the current stream before the gradient exists:
    # still running when push_pull_async returns, unless it waited for the stream.
    torch.cuda._sleep(2_000_000_000)
    g = x * 2
    h = bp.push_pull_async(g, "gpu.g")
    busy = not torch.cuda.current_stream().query()
    avg = bp.synchronize(h)
    out = {"busy": busy, "device": str(avg.device), "avg": avg.cpu().tolist()}
    bp.shutdown()
    return out


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")
def test_a_cuda_push_pull_returns_while_the_stream_still_computes(local_cluster):
    # The hook path must not synchronize the stream: push_pull_async of a gradient whose
    # kernels are still queued returns while they run (an event, waited for off-thread).
    c = local_cluster(workers=WORKERS)
    results = c.run_workers(cuda_overlap_worker, timeout=120)
    assert all(r.ok for r in results), c.describe(results)
    want = [sum(2.0 * (k + 1) for k in range(WORKERS)) / WORKERS] * 1000
    for r in results:
        assert r.value["busy"], r.value["busy"]
        assert r.value["device"].startswith("cuda"), r.value["device"]
        assert r.value["avg"] == want, r.value["avg"][:4]


def deferred_declarations_worker():
    # Rank 0's first push_pull of "late.a" waits (a gate, as a CUDA event does) while its
    # caller declares and pushes "late.b"; rank 1 pushes both at once. The declarations must be
    # checked in the same groups on both ranks, whenever the deferred push starts.
    class Gate:
        def __init__(self):
            self.open = threading.Event()

        def synchronize(self):
            self.open.wait(30)

    bp.init()
    r = bp.rank()
    gate = Gate() if r == 0 else None
    ha = bp.push_pull_async(torch.full((4,), float(r + 1)), "late.a", _ready=gate)
    hb = bp.push_pull_async(torch.full((3,), float(r + 1)), "late.b")
    b = bp.synchronize(hb).tolist()
    if gate is not None:
        gate.open.set()
    a = bp.synchronize(ha).tolist()
    bp.shutdown()
    return a, b


def test_a_deferred_first_push_pull_checks_its_declaration_in_the_callers_order(local_cluster):
    c = local_cluster(workers=WORKERS)
    results = c.run_workers(deferred_declarations_worker, timeout=60)
    assert all(r.ok for r in results), c.describe(results)
    for r in results:
        assert r.value == ([1.5] * 4, [1.5] * 3), r.value


def test_compression_namespace_builds_checked_specs():
    assert bp.Compression.none == "none" and bp.Compression.fp16 == "fp16"
    assert bp.Compression.default is None
    assert bp.Compression.topk(ratio=0.01) == "topk:ratio=0.01"
    assert bp.Compression.randomk(ratio=0.5, unbiased=True) == "randomk:ratio=0.5,unbiased=true"
    assert bp.Compression.dithering(levels=7) == "dithering:levels=7"
    with pytest.raises(ValueError, match=r"Compression.topk: compression 'topk:ratio=2'"):
        bp.Compression.topk(ratio=2)
    with pytest.raises(ValueError, match=r"give average or op, not both"):
        bp.allreduce(torch.ones(1), average=True, op=bp.Sum)


def test_none_fp32_average_and_sum_exact(core_run):
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    for out in core_run:
        assert out["avg32"].shape == (3, 4)
        assert torch.equal(out["avg32"], x * 1.5)  # (1x + 2x) / 2
        assert torch.equal(out["sum32"], x * 3)
        assert torch.equal(out["avg32_round2"], x * 3)


def test_none_fp16_average_exact(core_run):
    h = torch.arange(8, dtype=torch.float16) / 4
    for out in core_run:
        assert out["avg16"].dtype == torch.float16
        assert torch.equal(out["avg16"], (h.float() * 1.5).half())


def test_none_bf16_average_exact(core_run):
    b = torch.arange(8, dtype=torch.bfloat16) / 4
    for out in core_run:
        assert out["avgbf16"].dtype == torch.bfloat16
        assert torch.equal(out["avgbf16"], (b.float() * 1.5).bfloat16())


def test_inplace(core_run):
    for out in core_run:
        same, value = out["inplace"]
        assert same
        assert torch.equal(value, torch.full((5,), 1.5))


def test_onebit_both_workers_agree_and_match_reference(core_run):
    a, b = core_run[0]["onebit"], core_run[1]["onebit"]
    assert torch.equal(a, b)
    # Worker compression, server average, server compression (no error feedback).
    agg = (onebit(core_run[0]["onebit_in"]) + onebit(core_run[1]["onebit_in"])) / 2
    want = onebit(agg)
    assert torch.allclose(a.double(), want, rtol=1e-5, atol=0)
    assert (a.abs() == a.abs()[0]).all()  # one magnitude: the scale
    assert torch.equal(a < 0, agg < 0)  # the sign pattern of the aggregate
    # fp16: compressed in fp32 after the conversion, the result rounded to fp16 once.
    h0, h1 = core_run[0]["onebit16"], core_run[1]["onebit16"]
    assert h0.dtype == torch.float16 and torch.equal(h0, h1)
    agg16 = (onebit(core_run[0]["onebit_in"].half()) + onebit(core_run[1]["onebit_in"].half())) / 2
    assert torch.allclose(h0.double(), onebit(agg16), rtol=2e-3, atol=0)
    assert torch.equal(h0 < 0, agg16 < 0)


def test_async_overlap(core_run):
    for out in core_run:
        for i, o in enumerate(out["async"]):
            assert torch.equal(o, torch.full((3,), i + 0.5))  # (i + (i + 1)) / 2
        assert out["async_polled"]
        same, value = out["async_out"]
        assert same and torch.equal(value, torch.full((4,), 0.5))


def test_clear_local_errors(core_run):
    errors = core_run[0]["errors"]
    assert "noncontig" in errors["noncontig"] and "not contiguous" in errors["noncontig"]
    assert "'f64'" in errors["dtype"] and "torch.float64" in errors["dtype"]
    assert "'offcpu'" in errors["device"] and "CPU or CUDA tensors" in errors["device"]
    code, msg = errors["redeclare"]
    assert code == "InvalidArgument"
    assert "'avg32'" in msg and "12 x float32" in msg and "13 x float32" in msg


def test_broadcast_parameters_makes_rank1_equal_rank0(core_run):
    m0, m1 = core_run[0]["model"], core_run[1]["model"]
    torch.manual_seed(100)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    for k in m0:
        assert torch.equal(m0[k], m1[k]), k
        if k != "1.num_batches_tracked":
            assert torch.equal(m0[k], ref.state_dict()[k]), k
    assert m1["1.num_batches_tracked"].item() == 5


def test_broadcast_optimizer_state(core_run):
    (lr0, mom0), (lr1, mom1) = core_run[0]["opt"], core_run[1]["opt"]
    assert lr0 == lr1 == pytest.approx(0.1)
    for a, b in zip(mom0, mom1):
        assert torch.equal(a, b)
        assert torch.equal(a, torch.ones_like(a))  # rank 0's gradient (1) as first momentum


def test_ctrl_c_interrupts_a_wait(core_run):
    out = core_run[0]
    assert out["interrupted"] is not None, "KeyboardInterrupt did not reach the wait"
    assert out["interrupted"] < 1.0
    for o in core_run:
        assert torch.equal(o["late"], torch.full((3,), 1.5))


def test_stats(core_run):
    for out in core_run:
        s = out["stats"]
        assert s["bytes_pushed"] > 0 and s["bytes_pulled"] > 0
        assert s["ops_completed"] >= 10 and s["ops_failed"] == 0


# -------------------------------------------------------------------------------------------
# Workers that run different numbers of steps (uneven data).

def uneven_worker(steps):
    bp.init()
    out = {"error": None, "code": None, "failed_at": None}
    start = time.monotonic()
    try:
        for k in range(steps[bp.rank()]):
            bp.push_pull(torch.ones(8), "uneven.w")
    except bitpush.BitpushError as e:
        out.update(error=str(e), code=e.code, failed_at=k)
    out["seconds"] = time.monotonic() - start
    bp.shutdown(20)
    return out


def test_uneven_step_counts_fail_fast_naming_the_finished_worker(local_cluster):
    # Rank 0 pushes 3 rounds and ends; rank 1's 4th round would wait for a push that never
    # comes. It fails as soon as the scheduler says rank 0 is done (the op timeout is 30 s
    # here), with a message that names the cause; then both shut down cleanly.
    c = local_cluster(workers=WORKERS, op_timeout_s=30)
    results = c.run_workers(uneven_worker, args=({0: 3, 1: 4},), timeout=60)
    assert all(r.ok for r in results), c.describe(results)
    first, second = results[0].value, results[1].value
    assert first["error"] is None, first
    assert second["code"] == "FailedPrecondition" and second["failed_at"] == 3, second
    assert ("push_pull of tensor 'uneven.w' (its push_pull #4 here) cannot complete: worker 0 "
            "is done after 3 push_pulls of it" in second["error"]), second
    assert "different numbers of steps" in second["error"], second
    assert second["seconds"] < 10, second
    assert all(rc == 0 for rc in c.wait_exit(10).values())


# -------------------------------------------------------------------------------------------
# A declaration that differs between the workers.

def mismatch_worker():
    bp.init()
    n = 10 + bp.rank()
    try:
        bp.push_pull(torch.zeros(n), "fc.weight")
        return ("no error", "")
    except bitpush.BitpushError as e:
        return (e.code, str(e))
    finally:
        bp.shutdown(5)


def test_declaration_mismatch_names_the_tensor(local_cluster):
    c = local_cluster(workers=WORKERS)
    results = c.run_workers(mismatch_worker, timeout=60)
    assert all(r.value is not None for r in results), c.describe(results)
    for r in results:
        code, msg = r.value
        assert code == "InvalidArgument", (code, msg)
        assert "fc.weight" in msg
        assert "10" in msg and "11" in msg


# -------------------------------------------------------------------------------------------
# A server killed mid-training.

def training_worker(ready_dir):
    import os
    bp.init()
    t = torch.ones(4096)
    first = True
    try:
        while True:
            bp.push_pull(t, "w", compression="none")
            bp.push_pull(t, "v", compression="none")
            if first:
                open(os.path.join(ready_dir, "ready-%d" % bp.rank()), "w").close()
                first = False
            time.sleep(0.01)
    except bitpush.BitpushError as e:
        return (time.time(), e.code, str(e))
    finally:
        try:
            bp.shutdown(2)
        except bitpush.BitpushError:
            pass


def test_killed_server_fails_the_workers_within_the_heartbeat_bound(local_cluster):
    import os
    c = local_cluster(workers=WORKERS, servers=2, heartbeat_interval_ms=100,
                      heartbeat_timeout_ms=HEARTBEAT_TIMEOUT_MS)
    procs = [c.start_worker(training_worker, (c.dir,), w) for w in range(WORKERS)]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(c.dir, "ready-%d" % w)) for w in range(WORKERS)):
        assert all(p.poll() is None for p in procs), c.describe()
        time.sleep(0.02)
    killed_at = time.time()
    c.kill_server(1)
    results = c.wait_workers(procs, timeout=30)
    assert all(r.value is not None for r in results), c.describe(results)
    for r in results:
        failed_at, code, msg = r.value
        assert code in ("Unavailable", "Timeout", "RemoteError"), (code, msg)
        assert "server 1" in msg or "server:1" in msg, msg
        # The scheduler declares it dead after heartbeat_timeout; allow scheduling slack.
        assert failed_at - killed_at < HEARTBEAT_TIMEOUT_MS / 1000 + 2.0, (failed_at - killed_at,
                                                                           msg)


# -------------------------------------------------------------------------------------------
# Daemon mode: 2 nodes x 2 training processes, each node served by its bitpush-worker.

def daemon_worker():
    bp.init()  # BITPUSH_MODE=daemon, BITPUSH_LOCAL_SIZE=2 from LocalCluster.env
    r = bp.rank()
    x = torch.full((10,), float(r))
    avg = bp.push_pull(x, "x")
    total = bp.push_pull(x, "s", average=False)
    torch.manual_seed(r)
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.fill_(r)
    bp.broadcast_parameters(model.state_dict(), root_rank=2)
    bp.barrier()
    ids = (bp.rank(), bp.size(), bp.local_rank(), bp.local_size(), bp.node_rank(), bp.mode())
    bp.shutdown()
    return ids, avg, total, model.weight.detach().clone()


def test_daemon_mode_two_nodes_of_two_processes(local_cluster):
    c = local_cluster(workers=2, local_size=2)
    results = c.run_workers(daemon_worker, timeout=60)
    assert all(r.ok for r in results), c.describe(results)
    for r in results:
        ids, avg, total, weight = r.value
        assert ids == (2 * r.worker_rank + r.local_rank, 4, r.local_rank, 2, r.worker_rank,
                       "daemon")
        assert torch.equal(avg, torch.full((10,), 1.5))  # (0 + 1 + 2 + 3) / 4
        assert torch.equal(total, torch.full((10,), 6.0))
        assert torch.equal(weight, torch.full((2, 3), 2.0))  # rank 2's
    assert all(rc == 0 for rc in c.wait_exit(10).values()), c.describe(results)


# -------------------------------------------------------------------------------------------
# In-process: init errors need no cluster.

def test_init_without_config_names_what_is_missing(clean_env):
    with pytest.raises(ValueError) as e:
        bp.init()
    assert "BITPUSH_CONFIG" in str(e.value) and "BITPUSH_WORKER_RANK" in str(e.value)
    with pytest.raises(ValueError) as e:
        bp.init("/nonexistent.yaml")
    assert "BITPUSH_WORKER_RANK" in str(e.value) and "BITPUSH_CONFIG" not in str(e.value)
    assert not bp.is_initialized()


def test_init_with_a_missing_config_file_raises_bitpush_error(clean_env):
    with pytest.raises(bitpush.BitpushError) as e:
        bp.init("/nonexistent/cluster.yaml", rank=0)
    assert "/nonexistent/cluster.yaml" in str(e.value)
    assert e.value.code != "OK"
    with pytest.raises(bitpush.BitpushError) as e:
        bp.push_pull(torch.zeros(1), "x")
    assert "not initialized" in str(e.value)


def test_bad_environment_is_named(clean_env, monkeypatch):
    monkeypatch.setenv("BITPUSH_WORKER_RANK", "one")
    with pytest.raises(ValueError, match="BITPUSH_WORKER_RANK"):
        bp.init("x.yaml")
    monkeypatch.setenv("BITPUSH_WORKER_RANK", "0")
    monkeypatch.setenv("BITPUSH_MODE", "threads")
    with pytest.raises(ValueError, match="BITPUSH_MODE"):
        bp.init("x.yaml")


# -------------------------------------------------------------------------------------------
# The LANS kernel binding (the kernel itself: tests/unit/lans_test.cc).

@pytest.mark.skipif(not bitpush._C.HAVE_LANS, reason="built without bitpush_optimizers")
def test_lans_step_binding_matches_the_first_step_formula():
    C = bitpush._C
    assert C.lans_kernel_name() in ("avx512", "avx2", "scalar")
    o = C.LansOptions()
    assert (o.beta1, o.eps_inside_sqrt, o.trust_ratio_fallback) == (pytest.approx(0.9), False,
                                                                    True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1000, generator=g)
    grad = torch.randn(1000, generator=g)
    m, v = torch.zeros(1000), torch.zeros(1000)
    x0 = x.double().clone()
    C.lans_step(o, 0.01, 1, x.data_ptr(), m.data_ptr(), v.data_ptr(), grad.data_ptr(), 1000)
    # Step 1, no weight decay: m^ = g, v^ = g^2, r = c = g / (|g| + eps);
    # x -= lr * ||x|| / ||r|| * r (the beta1 and 1 - beta1 terms add up).
    gd = grad.double()
    r = gd / (gd.abs() + 1e-6)
    want = x0 - 0.01 * x0.norm() / r.norm() * r
    assert torch.allclose(x.double(), want, rtol=1e-5, atol=1e-6)
    assert torch.allclose(m.double(), 0.1 * gd, rtol=1e-6)
    o.beta1 = 1.5
    with pytest.raises(bitpush.BitpushError) as e:
        C.lans_step(o, 0.01, 1, x.data_ptr(), m.data_ptr(), v.data_ptr(), grad.data_ptr(), 1000)
    assert e.value.code == "InvalidArgument" and "beta1" in str(e.value)
