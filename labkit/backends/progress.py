"""The progress bar of ``Job.wait``: a tqdm bar (terminal or Jupyter, on stderr) over the
training iterations found in the log, with the job's state line (``labkit.backends.queue``)."""

from __future__ import annotations

import json
import re
import sys

from labkit.backends.queue import describe, latest_iteration
from labkit.run.state import JobLike, JobState

_ITER_RE = re.compile(rb"iteration\s+(\d+)\s*/\s*(\d+)")


class Progress:
    """A tqdm bar over training iterations, fed by reading the log's new bytes."""

    def __init__(self, job: JobLike):
        # tqdm: only while a progress bar is shown
        from tqdm.auto import tqdm

        self.job, self.offset, self.done, self.latest = job, 0, 0, None
        total = None
        try:
            total = json.loads((job.run_dir / "config.json").read_text()).get("train_iters")
        except (OSError, ValueError):
            pass
        self.bar = tqdm(total=total, desc=job.name, unit="it", file=sys.stderr, leave=True)

    def update(self, st: JobState) -> None:
        try:
            with open(self.job.log_path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except OSError:
            chunk = b""
        cut = chunk.rfind(b"\n") + 1  # only whole lines; the rest is read next time
        self.offset += cut
        its = [int(m.group(1)) for m in _ITER_RE.finditer(chunk[:cut])]
        if its and max(its) > self.done:
            self.bar.update(max(its) - self.done)
            self.done = max(its)

        self.latest = latest_iteration(chunk[:cut]) or self.latest
        self.bar.set_postfix_str(describe(str(st), backend=self.job.backend, job_id=self.job.job_id,
                                          info=self.job.info, latest=self.latest,
                                          log_path=self.job.log_path), refresh=True)

    def close(self) -> None:
        self.bar.close()
