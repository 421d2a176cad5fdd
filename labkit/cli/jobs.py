"""Commands about jobs: ``submit``, ``status``, ``watch``, ``logs``, ``cancel``.

They act only on labkit's own jobs: those with a ``job.json`` record under the run root.
"""

from __future__ import annotations

import argparse
import codecs
import sys
import time
from pathlib import Path
from typing import TextIO

from labkit.backends.diagnosis import failure_error
from labkit.classroom import find_job, my_jobs, my_roots
from labkit.cli.classroom import cmd_cancel_all
from labkit.cli.common import add_backend, add_cluster, add_json, for_cli_users, say, show_json, site_of, warn
from labkit.config import RunConfig
from labkit.jobs import job_states, submit
from labkit.run.state import JobState

JOB_HELP = "a labkit job: its job id, run name or run directory (see labkit status)"


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("submit", help="submit a run config (local, Slurm or hostfile backend)",
                       description="Write the run directory (config.json, job.sh, plan.json) "
                                   "and start the job. A run directory that already holds a run "
                                   "is refused unless --resume or --overwrite says what to do.")
    p.add_argument("config", metavar="CONFIG.json", help="the run config (e.g. from labkit new)")
    add_backend(p)
    add_cluster(p)
    p.add_argument("--wait", action="store_true",
                   help="wait for the job to finish, with a progress bar; exit 1 unless it "
                        "COMPLETED")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="with --wait: stop waiting after S seconds (the job keeps running)")
    p.add_argument("--hang-timeout", type=float, metavar="S",
                   help="with --wait: a job with no new iteration for S seconds is diagnosed "
                        "(stacks, suspect ranks) and cancelled")
    p.add_argument("--overwrite", action="store_true",
                   help="move an earlier run of the same name aside (nothing is deleted)")
    p.add_argument("--resume", action="store_true",
                   help="continue an earlier run of the same name from its checkpoint")
    add_json(p, '{"job_id", "name", "run_dir", "backend", "state"}')
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("status", help="the state of labkit's own jobs (one or all)",
                       description="List the jobs labkit submitted under the run root, with "
                                   "their state; jobs submitted some other way are not shown.")
    p.add_argument("job", nargs="?", metavar="JOB", help=JOB_HELP + " (default: all)")
    add_cluster(p, "the run root to list (its run_root, {user} filled in)")
    add_json(p, "the job record(s)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("watch", help="wait for a job with the hang watchdog",
                       description="Wait for a job to finish. A job with no new iteration for "
                                   "--hang-timeout seconds is diagnosed (per-rank last lines, "
                                   "py-spy stacks, suspect ranks; saved as hang-*.txt in its "
                                   "run directory) and cancelled.")
    p.add_argument("job", metavar="JOB", help=JOB_HELP)
    p.add_argument("--hang-timeout", type=float, default=300.0, metavar="S",
                   help="seconds without a new iteration that count as a hang (default: 300)")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="stop watching after S seconds (the job keeps running)")
    p.set_defaults(func=cmd_watch)

    p = sub.add_parser("logs", help="print (or follow) a job's log",
                       description="Print a labkit job's log.txt (a block at a time: a log of "
                                   "any size takes the same memory); with -f, follow it until the "
                                   "job finishes.")
    p.add_argument("job", metavar="JOB", help=JOB_HELP)
    p.add_argument("-f", "--follow", action="store_true",
                   help="keep printing new lines until the job finishes")
    p.add_argument("-n", "--tail", type=_positive, metavar="N",
                   help="start at the last N lines instead of the first line")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", help="cancel one of your labkit jobs, or all of them (--all)",
                       description="Cancel a job labkit submitted for you; a job submitted some "
                                   "other way, or another user's, is refused. --all cancels "
                                   "every pending or running labkit job of yours and nothing "
                                   "else.")
    p.add_argument("job", nargs="?", metavar="JOB", help=JOB_HELP)
    p.add_argument("--all", action="store_true",
                   help="every pending or running labkit job of yours (not your other jobs)")
    add_cluster(p, "the run root to look in")
    add_json(p, "the jobs cancelled")
    p.set_defaults(func=cmd_cancel)


# --- handlers ----------------------------------------------------------------------------------
def _finished(job, state, as_json: bool) -> int:  # noqa: ANN001 - a Job and its JobState

    if state is JobState.COMPLETED:
        return 0
    if state.finished and not as_json:
        warn(for_cli_users(str(failure_error(job, state))))
    elif not state.finished and not as_json:
        warn(f"stopped waiting; job {job.job_id} is still {state} (labkit watch {job.name})")
    return 1


def cmd_submit(args: argparse.Namespace) -> int:
    cfg = RunConfig.from_json(args.config)
    local = (args.backend or cfg.backend) == "local" and not args.cluster  # no site to read
    job = submit(cfg, backend=args.backend, cluster=None if local else site_of(args),
                 overwrite=args.overwrite, resume=args.resume)
    if args.wait:
        state = job.wait(timeout=args.timeout, progress=True, hang_timeout=args.hang_timeout)
    else:
        state = job.state()
    if args.json:
        show_json(job.to_dict(state))
    else:
        say(f"submitted {job.name} as {job.backend} job {job.job_id} -> {job.run_dir} "
            f"(log: {job.log_path}): {state}")
    return _finished(job, state, args.json) if args.wait else 0


def cmd_status(args: argparse.Namespace) -> int:
    site = site_of(args)
    jobs = [find_job(args.job, site)] if args.job else my_jobs(site)
    states = job_states(jobs)
    rows = [j.to_dict(states[j.job_id]) for j in jobs]
    if args.json:
        show_json(rows[0] if args.job else rows)
        return 0
    say(f"{'JOBID':>14} {'BACKEND':7} {'STATE':13} {'SUBMITTED':19} NAME (RUN_DIR)")
    for j, r in zip(jobs, rows, strict=True):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j.submitted_at))
        say(f"{r['job_id']:>14} {r['backend']:7} {r['state']:13} {when:19} "
            f"{r['name']} ({r['run_dir']})")
    if not jobs:
        say(f"(no labkit jobs of yours under {', '.join(map(str, my_roots(site)))})")
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    job = find_job(args.job, site_of(args))
    warn(f"watching {job.backend} job {job.job_id} ({job.name}); a hang is {args.hang_timeout:g} s "
         f"without a new iteration")
    state = job.wait(timeout=args.timeout, progress=True, hang_timeout=args.hang_timeout)
    say(f"{job.backend} job {job.job_id} ({job.name}): {state}")
    return _finished(job, state, False)


_BLOCK = 1 << 20  # bytes read and written at a time by labkit logs


def _positive(text: str) -> int:
    if not text.isdecimal() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of lines; give a whole number >= 1")
    return int(text)


def tail_offset(path: Path, lines: int) -> int:
    """Where the last ``lines`` lines of the file begin, found reading back from its end a block at
    a time (0 for a shorter file or one that cannot be read)."""
    try:
        with open(path, "rb") as f:
            pos = f.seek(0, 2)
            f.seek(max(0, pos - 1))
            need = lines + (f.read(1) == b"\n")  # a final newline ends the last line, starts none
            while pos > 0:
                start = max(0, pos - _BLOCK)
                f.seek(start)
                block, i = f.read(pos - start), pos - start
                while (i := block.rfind(b"\n", 0, i)) >= 0:
                    need -= 1
                    if need == 0:
                        return start + i + 1
                pos = start
    except OSError:
        pass
    return 0


def copy_log(path: Path, offset: int, out: TextIO, decoder: codecs.IncrementalDecoder) -> int:
    """Write the file from ``offset`` on to ``out``, a block at a time (memory stays at one
    block whatever the file's size); returns the offset reached. ``decoder`` keeps a character
    split between two blocks (or two calls) whole."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while block := f.read(_BLOCK):
                out.write(decoder.decode(block))
                offset += len(block)
    except OSError:
        pass
    out.flush()
    return offset


def cmd_logs(args: argparse.Namespace) -> int:
    job = find_job(args.job, site_of(args))
    offset = tail_offset(job.log_path, args.tail) if args.tail else 0
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while True:
        finished = job.state().finished  # before reading: the last read then sees every line
        offset = copy_log(job.log_path, offset, sys.stdout, decoder)
        if not args.follow or finished:
            sys.stdout.write(decoder.decode(b"", final=True))
            return 0
        time.sleep(1.0)


def cmd_cancel(args: argparse.Namespace) -> int:
    if args.all == bool(args.job):
        warn("labkit cancel: name one JOB to cancel, or --all for every labkit job of yours")
        return 2
    if args.all:
        return cmd_cancel_all(args)
    job = find_job(args.job, site_of(args))
    before = job.state()
    if not job.cancel():
        say(f"{job.backend} job {job.job_id} ({job.name}) had already ended ({before}); "
            f"nothing to cancel")
        return 0
    after, end = job.state(), time.time() + 15  # Slurm takes a moment to end a job
    while not after.finished and time.time() < end:
        time.sleep(0.5)
        after = job.state()
    if not after.finished:
        warn(f"{job.backend} job {job.job_id} ({job.name}) is still {after} after the cancel "
             f"request; check again with labkit status {job.job_id}")
        return 1
    say(f"cancelled {job.backend} job {job.job_id} ({job.name}): {after}")
    return 0
