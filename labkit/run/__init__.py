"""The run's own layer: what a job is, below everything that renders, starts or watches it.

- ``labkit.run.spec``: ``JobSpec``, the shape of a job (all a backend is given and all a job
  script is rendered from), made from a RunConfig once where the run enters;
- ``labkit.run.state``: ``JobState`` and ``JobLike``, the face of a job that watchers read;
- ``labkit.run.record``: the job record, ``job.json``: what it holds, how it is written and
  read.

``labkit.render`` and the backends (``labkit.backends``) import this package; it imports
nothing of theirs, nor anything above them (``labkit.jobs``, where a submission is put
together, the command line, the notebooks' ``labkit.lab``).
"""

from __future__ import annotations

from labkit.run.record import JOB_FILE, BadRecord, NoRecord, RecordError, read_record, write_record
from labkit.run.spec import JobSpec
from labkit.run.state import FINISHED, JobLike, JobState

__all__ = ["FINISHED", "JOB_FILE", "BadRecord", "JobLike", "JobSpec", "JobState", "NoRecord",
           "RecordError", "read_record", "write_record"]
