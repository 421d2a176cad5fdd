"""``labkit doctor``: preflight checks before a lab, each PASS / WARN / FAIL (with a fix) or SKIP.

The most common multi-node failure is a job that hangs at start-up with no error: a firewall,
the wrong interface, a run root that is not shared, a port the whole class shares. The doctor
catches these before anyone trains. The checks are small functions listed as data in
``labkit.doctor.checks.CHECKS``; the node-wide ones share one probe job
(``code/doctor_probe.py``): on Slurm a job rendered and submitted like any other (the site's
options, modules, container and env), waited for within ``timeout_s`` (then its state and queue
reason are named and it is cancelled); two local processes otherwise. ``for_class=True``
(``labkit doctor --class``) adds the instructor's checks: per-user run roots, and whether
``students`` jobs of the series fit the partition at once.

    results = run_doctor()                  # or run_doctor("site.yaml", for_class=True, students=20)
    render_table(results)                   # the text table `labkit doctor` shows
    doctor_json(results)                    # {"checks": [{"name", "status", "detail", "fix"}]}
"""

from labkit.doctor.checks import CHECKS, CLASS_CHECKS, FAIL, PASS, SKIP, WARN, Result
from labkit.doctor.preflight import Context, ProbeRun, doctor_json, render_table, run_doctor

__all__ = ["CHECKS", "CLASS_CHECKS", "FAIL", "PASS", "SKIP", "WARN", "Context", "ProbeRun",
           "Result", "doctor_json", "render_table", "run_doctor"]
