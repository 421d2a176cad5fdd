"""What the class's JupyterHub config (``code/hub/*.py``) takes from labkit: the site's spawner
settings and a SlurmSpawner that finds a compute node by its Slurm address.

Imported by the hub process only (it needs ``batchspawner``, the ``hub`` extra). The hub config
reads its settings from the environment ``labkit class hub up`` gives it (``HubSettings``), so an
instructor can also run ``jupyterhub -f code/hub/slurm_config.py`` with the same variables.
"""

from __future__ import annotations

import os
import shlex
import socket
from dataclasses import dataclass
from pathlib import Path

from batchspawner import SlurmSpawner

from labkit import slurmcli
from labkit.site import ClusterProfile, load_cluster

# The job each student's JupyterLab runs in (Slurm job name labkit-hub-<user>; its log in the
# student's home). {{prologue}}: the site's modules and setup lines, then the hand-out, as the
# student. The singleuser command (batchspawner's port-reporting wrapper) runs as a job step.
BATCH_SCRIPT = """#!/bin/bash
#SBATCH --job-name=labkit-hub-{{username}}
#SBATCH --output={{homedir}}/labkit-jupyter-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
#SBATCH --nodes=1
#SBATCH --ntasks=1
{% if nprocs %}#SBATCH --cpus-per-task={{nprocs}}
{% endif %}{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if memory %}#SBATCH --mem={{memory}}
{% endif %}{% if qos %}#SBATCH --qos={{qos}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}
set -euo pipefail
trap 'echo SIGTERM received' TERM
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
echo "jupyterhub-singleuser ended gracefully"
{{epilogue}}
"""
JOB_PREFIX = "labkit-hub-"


@dataclass(frozen=True)
class HubSettings:
    """The hub's settings from the environment (``labkit class hub up`` sets them)."""

    state_dir: Path
    site_path: str | None
    public_url: str
    hub_ip: str
    hub_port: int
    proxy_api_port: int
    proxy_command: str
    token_file: Path
    group: str | None
    cull_s: int
    notebook_dir: str
    cpus: int

    @classmethod
    def from_env(cls) -> HubSettings:
        env = os.environ
        state = Path(env.get("LABKIT_HUB_DIR", "/var/lib/labkit-hub"))
        return cls(state_dir=state, site_path=env.get("LABKIT_HUB_SITE") or None,
                   public_url=env.get("LABKIT_HUB_URL", "http://127.0.0.1:8000"),
                   hub_ip=env.get("LABKIT_HUB_IP", "0.0.0.0"),
                   hub_port=int(env.get("LABKIT_HUB_PORT", "8081")),
                   proxy_api_port=int(env.get("LABKIT_HUB_PROXY_API_PORT", "8001")),
                   proxy_command=env.get("LABKIT_HUB_PROXY", "configurable-http-proxy"),
                   token_file=Path(env.get("LABKIT_HUB_TOKEN_FILE", str(state / "api_token"))),
                   group=env.get("LABKIT_HUB_GROUP") or None,
                   cull_s=int(env.get("LABKIT_HUB_CULL_S", "3600")),
                   notebook_dir=env.get("LABKIT_HUB_NOTEBOOK_DIR", "~/labkit-notebooks"),
                   cpus=int(env.get("LABKIT_HUB_CPUS", "1")))

    def site(self) -> ClusterProfile:
        return load_cluster(self.site_path) if self.site_path else ClusterProfile()

    def admin_token(self) -> str:
        return self.token_file.read_text().strip()


def prologue(site: ClusterProfile, notebook_dir: str) -> str:
    """The job's first lines: the site's modules and setup lines (they put the class's Python
    on PATH), then the hand-out into the student's notebook folder (as the student)."""
    # sbatch --export=<the hub's variables> leaves SLURM_EXPORT_ENV in the job: the student's
    # own jobs, submitted from the notebooks, would otherwise get only those variables too
    lines = ["unset SLURM_EXPORT_ENV"]
    lines += [f"module load {shlex.quote(m)}" for m in site.modules] + list(site.setup)
    target = notebook_dir.replace("~", "$HOME", 1) if notebook_dir.startswith("~") else \
        shlex.quote(notebook_dir)
    lines.append(f'python -m labkit class handout --to "{target}" || '
                 f'echo "labkit: the hand-out failed; the server starts anyway" >&2')
    return "\n".join(lines)


def sbatch_options(site: ClusterProfile) -> str:
    """What the site adds to every job besides partition and qos: account, extras."""
    opts = [f"--account={site.account}"] if site.account else []
    return " ".join(opts + list(site.sbatch_extra))


def run_root_for(site: ClusterProfile, user: str) -> str | None:
    path = site.run_root_path(user)
    return str(path) if path else None


class LabkitSlurmSpawner(SlurmSpawner):
    """batchspawner's SlurmSpawner, two things changed for a class:

    - the server listens on every address of its node: batchspawner resets ``ip`` to the
      trait default (127.0.0.1 in JupyterHub 5 and later) before building the environment,
      and the single-user server takes its address from ``$JUPYTERHUB_SERVICE_URL``, which
      would leave it unreachable from the hub;
    - the hub connects to the node's address as Slurm knows it (``NodeAddr``), not its name,
      which the hub's host may not resolve (the mini-cluster's nodes are namespaces).
    """

    def get_env(self):
        env = super().get_env()
        url = env.get("JUPYTERHUB_SERVICE_URL", "")
        if "://127.0.0.1:" in url:
            env["JUPYTERHUB_SERVICE_URL"] = url.replace("://127.0.0.1:", "://0.0.0.0:", 1)
        return env

    def state_gethost(self):
        name = super().state_gethost()
        if not name:
            return name
        conf = os.environ.get("SLURM_CONF")
        addrs = {n: a for n, a, _, _ in slurmcli.node_addresses(conf)}
        if addrs.get(name) and addrs[name] != name:
            return addrs[name]
        try:
            socket.gethostbyname(name)
        except OSError:
            self.log.warning("node %s does not resolve and Slurm names no NodeAddr for it", name)
        return name


__all__ = ["BATCH_SCRIPT", "JOB_PREFIX", "HubSettings", "LabkitSlurmSpawner", "prologue",
           "run_root_for", "sbatch_options"]
