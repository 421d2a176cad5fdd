"""The Open OnDemand recipe (code/hub/ood/labkit_jupyter): its YAML parses as OnDemand reads
it, and its job script, rendered and run, sets up the JupyterLab as the hub's server job does
(code/hub/slurm_config.py, labkit.hub_spawner.prologue). There is no OnDemand here: its bash
helpers (find_port, create_passwd) and the final `jupyter lab` are stand-ins that record what
they were given; the site profile, labkit and the hand-out are real."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml
from conftest import REPO

from labkit.site import load_cluster

APP = REPO / "code" / "hub" / "ood" / "labkit_jupyter"
ERB = re.compile(r"<%=\s*(.*?)\s*%>")


def _render(text: str, values: dict[str, str]) -> str:
    """OnDemand's ERB for the tags the recipe uses: `<%= context.NAME %>`, `<%= NAME... %>`."""
    def sub(m: re.Match) -> str:
        expr = m.group(1)
        name = re.match(r"(?:context\.)?(\w+)", expr).group(1)
        return values.get(name, values.get(expr, "X"))
    return ERB.sub(sub, text)


def test_the_recipe_parses_as_an_interactive_app():
    manifest = yaml.safe_load((APP / "manifest.yml").read_text())
    assert manifest["role"] == "batch_connect"
    form = yaml.safe_load((APP / "form.yml").read_text())
    attrs = form["attributes"]
    assert set(form["form"]) == set(attrs)
    assert attrs["labkit_site"]["widget"] == "hidden_field" and attrs["labkit_site"]["value"]
    submit = yaml.safe_load(_render((APP / "submit.yml.erb").read_text(),
                                    {"bc_num_hours.to_i * 3600": "10800",
                                     "num_cores.to_i": "2", "ENV['USER']": "alice"}))
    assert submit["batch_connect"] == {"template": "basic", "conn_params": ["password"]}
    assert submit["script"]["wall_time"] == 10800
    assert "--cpus-per-task=2" in submit["script"]["native"]
    assert 'name="password"' in (APP / "view.html.erb").read_text()


def _hub_sets() -> set[str]:
    """The variables the hub's config gives every server job."""
    conf = (REPO / "code" / "hub" / "slurm_config.py").read_text()
    return set(re.findall(r'environment(?:\[|\s*=\s*\{)\s*"([A-Z_]+)"', conf))


def test_the_job_script_sets_up_jupyterlab_as_the_hubs_server_job(tmp_path):
    assert _hub_sets() == {"OMP_NUM_THREADS", "LABKIT_CLUSTER", "LABKIT_RUN_ROOT"}
    site = tmp_path / "site.yaml"
    site.write_text(f"name: class\npartition: lab\nrun_root: {tmp_path}/shared/{{user}}/runs\n")
    home, work, fake = tmp_path / "home", tmp_path / "job", tmp_path / "bin"
    for d in (home, work, fake):
        d.mkdir()
    seen = tmp_path / "jupyter.seen"
    (fake / "jupyter").write_text(f"#!/bin/sh\n{{ echo \"$@\"; env; }} > {seen}\n")
    (fake / "jupyter").chmod(0o755)
    setup = (f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH; "
             f"export PATH={fake}:$PATH")
    values = {"labkit_site": str(site), "labkit_setup": setup, "num_cores": "2"}
    before = _render((APP / "template" / "before.sh.erb").read_text(), values)
    script = _render((APP / "template" / "script.sh.erb").read_text(), values)
    helpers = "find_port() { echo 41234; }\ncreate_passwd() { echo s3cret; }\nhost=node1\n"
    (work / "job.sh").write_text(helpers + before + "\n" + script)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LABKIT_", "SLURM_"))}
    p = subprocess.run(["bash", str(work / "job.sh")], cwd=work, capture_output=True, text=True,
                       env={**env, "HOME": str(home), "SLURM_EXPORT_ENV": "NONE"}, timeout=120)
    assert p.returncode == 0, p.stderr
    args, *lines = seen.read_text().splitlines()
    got = dict(ln.split("=", 1) for ln in lines if "=" in ln)
    assert got["LABKIT_CLUSTER"] == str(site)
    assert got["LABKIT_RUN_ROOT"] == str(load_cluster(str(site)).run_root_path())
    assert got["OMP_NUM_THREADS"] == "2" and "SLURM_EXPORT_ENV" not in got
    assert args.split() == ["lab", f"--config={work}/config.py",
                            f"--notebook-dir={home}/labkit-notebooks"]
    given = sorted(q.name for q in (home / "labkit-notebooks").glob("*.ipynb"))
    assert "01_single_node.ipynb" in given and not (home / "labkit-notebooks" / "ANSWERS.md").exists()
    config = (work / "config.py").read_text()
    assert "c.ServerApp.base_url = '/node/node1/41234/'" in config
    assert "c.IdentityProvider.token = 's3cret'" in config
