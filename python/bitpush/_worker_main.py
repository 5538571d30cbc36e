"""The entry point of a worker process started by bitpush.testing.LocalCluster.run_workers
with a callable: ``python -m bitpush._worker_main JOB.pkl``.

JOB.pkl names the function by file, module and qualified name (the function need not be
importable by module name: test files are loaded from their path) and holds its arguments. The
outcome — {"value": return value} or {"error": traceback text} — is pickled to the job's result
path. Exit status: 0 when the function returned, 1 when it raised.
"""
import importlib
import importlib.util
import os
import pickle
import sys
import traceback


def _load(job):
    module = sys.modules.get(job["module"])
    if module is None and job["module"] != "__main__":
        try:
            module = importlib.import_module(job["module"])
        except ImportError:
            module = None
    if module is None or not hasattr(module, job["qualname"].split(".")[0]):
        name = "_bitpush_job_" + os.path.splitext(os.path.basename(job["file"]))[0]
        sys.path.insert(0, os.path.dirname(job["file"]))
        spec = importlib.util.spec_from_file_location(name, job["file"])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    obj = module
    for part in job["qualname"].split("."):
        obj = getattr(obj, part)
    return obj


def main(argv):
    with open(argv[1], "rb") as f:
        job = pickle.load(f)
    try:
        fn = _load(job)
        outcome = {"value": fn(*job["args"])}
        status = 0
    except BaseException:  # noqa: B902 (report everything, KeyboardInterrupt included)
        outcome = {"error": traceback.format_exc()}
        sys.stderr.write(outcome["error"])
        status = 1
    try:
        data = pickle.dumps(outcome)
    except Exception:
        data = pickle.dumps({"value": None, "error": outcome.get("error")
                             or "the return value is not picklable"})
    with open(job["result"], "wb") as f:
        f.write(data)
    sys.stdout.flush()
    sys.stderr.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
