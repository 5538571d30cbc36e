"""``Checkpointer``: periodic job checkpoints in a directory, and the resume that a restarted job
(``bitpush launch --max-restarts``) or a server restarted alone starts from (docs/training.md,
"Checkpointer").

    ckpt = bp.Checkpointer("ckpt", model, opt, every_steps=50, state={"lr": sched})
    step = ckpt.resume()              # 0 on a fresh job (after writing the step-0 checkpoint)
    while step < total:
        try:
            train_one_step(step)
            step += 1
            ckpt.step(step)           # every 50 steps: a checkpoint (collective)
        except bp.BitpushError as e:
            step = ckpt.recover(e)    # a server restarted alone: back to the newest checkpoint

Each checkpoint is ``save_checkpoint``'s files (python/bitpush/torch/checkpoint.py) in its own
directory, ``<dir>/step-<8 digits>/job.pt`` and ``job.pt.node<k>``, plus ``COMPLETE``, which
rank 0 writes (aside, then renamed) once save_checkpoint returned, i.e. once every process's
part is on disk. A directory without it is a checkpoint a death interrupted: never loaded, and
removed by rank 0 at the next save, with every complete one but the newest ``keep``. ``state``
objects (an lr scheduler, a GradScaler: anything with ``state_dict`` / ``load_state_dict``,
holding the same values on every process) travel in job.pt.

Which checkpoint: rank 0 picks the newest complete one and broadcasts its step, so every process
loads the same (the directory must be the same on every node: a shared file system, or one
host). With ``every_seconds`` rank 0's clock decides and its decision is broadcast at every
``step()`` (one 1-byte broadcast per step).

Resuming is bit for bit where ``load_checkpoint`` is: the model, the optimizer, the residuals,
the servers' state and the ``state`` objects. The script's own position is the step: its data
order and schedule must follow from the step number alone (the examples replay their shuffles
up to it; docs/training.md).

Thread-safety: every method is collective; call them from the training thread of every process,
in the same order, with no push_pull in flight.
"""

import os
import re
import shutil
import sys
import time

import torch

from .. import _env
from .broadcast import broadcast_parameters
from .checkpoint import load_checkpoint, save_checkpoint
from .errors import BitpushError
from .session import rank, wait_for_servers

__all__ = ["Checkpointer"]

_STEP_DIR = re.compile(r"^step-(\d{8,})$")
_COMPLETE = "COMPLETE"
_FILE = "job.pt"


def _unavailable(error):
    """Whether `error`, or an error it was raised from, is a BitpushError with code
    Unavailable (a server died; with server_rejoin_timeout_s the job waits for it)."""
    while error is not None:
        if isinstance(error, BitpushError) and getattr(error, "code", None) == "Unavailable":
            return True
        error = error.__cause__
    return False


class Checkpointer:
    def __init__(self, directory, model=None, optimizer=None, every_steps=None,
                 every_seconds=None, keep=2, state=None):
        if every_steps is None and every_seconds is None:
            raise ValueError("bitpush.Checkpointer: give every_steps or every_seconds")
        if every_steps is not None and (not isinstance(every_steps, int) or every_steps < 1):
            raise ValueError("bitpush.Checkpointer: every_steps must be a positive integer, "
                             "got %r" % (every_steps,))
        if every_seconds is not None and not every_seconds > 0:
            raise ValueError("bitpush.Checkpointer: every_seconds must be > 0, got %r"
                             % (every_seconds,))
        if not isinstance(keep, int) or keep < 1:
            raise ValueError("bitpush.Checkpointer: keep must be at least 1, got %r" % (keep,))
        self.directory = os.path.abspath(os.fspath(directory))
        self.model, self.optimizer = model, optimizer
        self.every_steps, self.every_seconds, self.keep = every_steps, every_seconds, keep
        self.state = dict(state or {})
        self.saved_step = None  # the step of the newest checkpoint this job wrote or loaded
        self._last_save = time.monotonic()

    # -- where --------------------------------------------------------------------------------

    def path_of(self, step):
        """The job.pt of the checkpoint at `step`."""
        return os.path.join(self.directory, "step-%08d" % step, _FILE)

    def complete_steps(self):
        """The steps of the complete checkpoints in the directory, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        steps = []
        for n in names:
            m = _STEP_DIR.match(n)
            if m and os.path.exists(os.path.join(self.directory, n, _COMPLETE)):
                steps.append(int(m.group(1)))
        return sorted(steps)

    # -- collective calls ----------------------------------------------------------------------

    def resume(self, model=None, optimizer=None):
        """Loads the newest complete checkpoint and returns its step; on a fresh job (none in
        the directory) writes the step-0 checkpoint, so a server restarted before the first
        periodic one has a state to go back to, and returns 0. Collective."""
        self._bind(model, optimizer)
        t0 = time.monotonic()
        # The optimizer's tensors first, in the order its first step would declare them: their
        # keys (and the random streams drawn per key) are those of a run without a
        # Checkpointer, whose own broadcast tensors come after.
        self.optimizer._bp_declare_all()
        newest = self._agreed_newest()
        if newest is None:
            self.save(0)
            return 0
        self._load(newest)
        if rank() == 0:
            print("bitpush: resumed from %s (step %d, restart %d) in %.2f s"
                  % (os.path.dirname(self.path_of(newest)), newest, _env.restart_count(),
                     time.monotonic() - t0), file=sys.stderr, flush=True)
        return newest

    def step(self, step):
        """Call after every optimizer step with the number of steps done: writes a checkpoint
        when one is due (every_steps divides `step`, or every_seconds passed on rank 0).
        Returns whether it wrote one. Collective."""
        due = self.every_steps is not None and step % self.every_steps == 0
        if self.every_seconds is not None:
            flag = torch.tensor([1 if time.monotonic() - self._last_save >= self.every_seconds
                                 else 0], dtype=torch.uint8)
            broadcast_parameters({"bitpush.checkpointer.due": flag}, root_rank=0)
            due = due or bool(flag.item())
        if due and step != self.saved_step:
            self.save(step)
            return True
        return False

    def save(self, step):
        """Writes the checkpoint of `step` now (collective), marks it complete and removes the
        older ones beyond `keep` and any a death left incomplete."""
        path = self.path_of(step)
        extra = {"step": step, "state": {k: v.state_dict() for k, v in self.state.items()}}
        save_checkpoint(path, self.model, self.optimizer, extra=extra)
        if rank() == 0:
            marker = os.path.join(os.path.dirname(path), _COMPLETE)
            tmp = "%s.tmp.%d" % (marker, os.getpid())
            with open(tmp, "w") as f:
                f.write("%d\n" % step)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, marker)
            self._prune(step)
        self.saved_step = step
        self._last_save = time.monotonic()

    def recover(self, error):
        """After a push_pull raised `error`: a server died and the YAML lets it rejoin
        (BitpushError code Unavailable) — waits for it (wait_for_servers), loads the newest
        complete checkpoint and returns its step, where the loop goes on. Any other error is
        raised again. Collective (every process meets the failure)."""
        if not _unavailable(error):
            raise error
        wait_for_servers()
        newest = self._agreed_newest()
        if newest is None:
            raise BitpushError("bitpush.Checkpointer: a server restarted, but %s holds no "
                               "complete checkpoint to go back to (call resume() before the "
                               "first step)" % self.directory) from error
        self._load(newest)
        if rank() == 0:
            print("bitpush: a server restarted; back to step %d (%s)"
                  % (newest, os.path.dirname(self.path_of(newest))), file=sys.stderr,
                  flush=True)
        return newest

    # -- internals -----------------------------------------------------------------------------

    def _bind(self, model, optimizer):
        if model is not None:
            self.model = model
        if optimizer is not None:
            self.optimizer = optimizer
        if self.model is None or self.optimizer is None:
            raise ValueError("bitpush.Checkpointer: give the model and the optimizer (to the "
                             "constructor or to resume())")

    def _agreed_newest(self):
        """Rank 0's newest complete step, broadcast (-1: none)."""
        steps = self.complete_steps() if rank() == 0 else []
        t = torch.tensor([steps[-1] if steps else -1], dtype=torch.int64)
        broadcast_parameters({"bitpush.checkpointer.newest": t}, root_rank=0)
        newest = int(t.item())
        return None if newest < 0 else newest

    def _load(self, step):
        extra = load_checkpoint(self.path_of(step), self.model, self.optimizer)
        saved = (extra or {}).get("state", {})
        missing = sorted(set(self.state) - set(saved))
        if missing:
            raise ValueError("bitpush.Checkpointer: %s holds no state '%s' (it has: %s)"
                             % (self.path_of(step), missing[0],
                                ", ".join(sorted(saved)) or "none"))
        for k, obj in self.state.items():
            obj.load_state_dict(saved[k])
        self.saved_step = step
        self._last_save = time.monotonic()

    def _prune(self, newest):
        complete = self.complete_steps()
        keep = set(complete[-self.keep:]) | {newest}
        for n in os.listdir(self.directory):
            m = _STEP_DIR.match(n)
            if m and int(m.group(1)) not in keep:
                shutil.rmtree(os.path.join(self.directory, n), ignore_errors=True)
