# The class's JupyterHub on a Slurm site: each student logs in as their Unix user and their
# JupyterLab runs as a Slurm job of theirs on a compute node (batchspawner's SlurmSpawner).
#
# `sudo labkit class hub up --cluster /shared/labkit/site.yaml` runs `jupyterhub -f` on this
# file with the settings below in its environment (labkit.hub_spawner.HubSettings reads them);
# copy it next to your site profile and adapt it, then pass `--config YOUR_COPY.py`.
# What is taken from the site profile ($LABKIT_HUB_SITE; the students' servers get it as
# $LABKIT_CLUSTER): partition, account, qos, time limit,
# sbatch_extra (your reservation), modules and setup lines (they must put the class's Python,
# with the `hub` extra installed, on PATH), the per-student run root.
import os
import sys

from labkit.hub_spawner import (
    BATCH_SCRIPT,
    HubSettings,
    LabkitSlurmSpawner,
    prologue,
    run_root_for,
    sbatch_options,
)

c = get_config()  # noqa: F821 - JupyterHub's config loader defines it
s = HubSettings.from_env()
site = s.site()

# --- where the hub listens -----------------------------------------------------------------------
# bind_url: what students open (put TLS in front of it: c.JupyterHub.ssl_cert / ssl_key, or a
# reverse proxy). hub_ip: an address of this host that the compute nodes reach; the servers
# on the nodes call the hub's API there.
c.JupyterHub.bind_url = s.public_url
c.JupyterHub.hub_ip = s.hub_ip
c.JupyterHub.hub_port = s.hub_port
c.JupyterHub.db_url = f"sqlite:///{s.state_dir / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(s.state_dir / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(s.state_dir / "jupyterhub.pid")
c.ConfigurableHTTPProxy.command = [s.proxy_command]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{s.proxy_api_port}"
c.ConfigurableHTTPProxy.pid_file = str(s.state_dir / "jupyterhub-proxy.pid")

# --- who may log in ------------------------------------------------------------------------------
# PAM: the students' Unix passwords on this host. A site with its own sign-on swaps in its
# authenticator here (e.g. `pip install oauthenticator`, c.JupyterHub.authenticator_class =
# "generic-oauth" with its client id and URLs); the username it returns must be the student's
# Unix user, since the job runs as that user.
c.JupyterHub.authenticator_class = "pam"
if s.group:
    c.Authenticator.allowed_groups = {s.group}  # the class: one Unix group
else:
    c.Authenticator.allow_existing_users = True  # only users the admin API created

# --- each student's JupyterLab: a Slurm job of theirs ---------------------------------------------
c.JupyterHub.spawner_class = LabkitSlurmSpawner
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = s.notebook_dir
c.Spawner.start_timeout = 300  # queue wait included; raise it when the class waits in a queue
c.Spawner.http_timeout = 120
# The job's environment: the site's setup lines make it, not the hub's (root's) variables.
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL"]
c.Spawner.environment = {"OMP_NUM_THREADS": str(s.cpus)}
if s.site_path:  # the notebooks' and labkit's site: every command defaults to it
    c.Spawner.environment["LABKIT_CLUSTER"] = s.site_path
if site.run_root:  # each student's runs in their own run root (labkit reads $LABKIT_RUN_ROOT)
    c.Spawner.environment["LABKIT_RUN_ROOT"] = lambda spawner: run_root_for(site, spawner.user.name)
if os.geteuid() == 0:  # the hub as root: sbatch, squeue and scancel run as the student
    c.LabkitSlurmSpawner.exec_prefix = "runuser -u {username} --"
else:  # a hub user with sudo rights for these three commands (sudoers), batchspawner's default
    c.LabkitSlurmSpawner.exec_prefix = "sudo -E -u {username}"
c.LabkitSlurmSpawner.batch_script = BATCH_SCRIPT
c.LabkitSlurmSpawner.req_partition = site.partition or ""
c.LabkitSlurmSpawner.req_qos = site.qos or ""
c.LabkitSlurmSpawner.req_runtime = site.time_limit  # a server lives as long as a job may
c.LabkitSlurmSpawner.req_nprocs = str(s.cpus)
c.LabkitSlurmSpawner.req_memory = ""  # e.g. "8G" where the site wants memory asked for
c.LabkitSlurmSpawner.req_options = sbatch_options(site)
c.LabkitSlurmSpawner.req_prologue = prologue(site, s.notebook_dir)
# The server as a job step with the job's whole environment: sbatch --export=<the hub's
# variables> would otherwise leave out what the prologue set (PATH to the class's Python).
c.LabkitSlurmSpawner.req_srun = "srun --export=ALL"
if site.slurm_conf:
    c.LabkitSlurmSpawner.req_keepvars_extra = "SLURM_CONF"

# --- services: the admin token of `labkit class hub status`, the idle culler -------------------
c.JupyterHub.services = [
    {"name": "labkit-admin", "api_token": s.admin_token()},
    {"name": "idle-culler",
     "command": [sys.executable, "-m", "jupyterhub_idle_culler", f"--timeout={s.cull_s}"]},
]
c.JupyterHub.load_roles = [
    {"name": "labkit-admin", "services": ["labkit-admin"],
     "scopes": ["admin:users", "admin:servers", "list:users", "read:users", "servers",
                "access:servers", "tokens"]},
    {"name": "idle-culler", "services": ["idle-culler"],
     "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]},
]
c.JupyterHub.cleanup_servers = True  # `labkit class hub down` ends every student's server job
