"""``labkit doctor``: preflight checks before a lab, each PASS / WARN / FAIL (with a fix) or SKIP.

The most common multi-node failure is a job that hangs at start-up with no error: a firewall,
the wrong interface, a run root that is not shared, a port the whole class shares. The doctor
catches these before anyone trains. The checks are small functions listed as data in
``labkit.doctor.checks.CHECKS``; the node-wide ones share one probe job
(``code/doctor_probe.py``): srun on every node when a Slurm cluster answers, two local processes
otherwise.

    results = run_doctor()                  # or run_doctor(cluster="local-minicluster")
    render_table(results)                   # the text table `labkit doctor` shows
    doctor_json(results)                    # {"checks": [{"name", "status", "detail", "fix"}]}
"""

from labkit.doctor.checks import CHECKS, FAIL, PASS, SKIP, WARN, Result
from labkit.doctor.preflight import Context, ProbeRun, doctor_json, render_table, run_doctor

__all__ = ["CHECKS", "FAIL", "PASS", "SKIP", "WARN", "Context", "ProbeRun", "Result", "doctor_json",
           "render_table", "run_doctor"]
