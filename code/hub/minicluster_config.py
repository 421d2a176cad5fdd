# The class's JupyterHub on labkit's Slurm mini-cluster (`sudo labkit cluster up`): the generic
# Slurm config (slurm_config.py beside this file) with the mini-cluster's network. The nodes are
# network namespaces on the bridge 10.77.0.1/24: the hub listens there for the servers, and
# students open the proxy on this machine's loopback.
import os

load_subconfig(os.path.join(os.path.dirname(__file__), "slurm_config.py"))  # noqa: F821

c = get_config()  # noqa: F821
c.JupyterHub.hub_ip = os.environ.get("LABKIT_HUB_IP", "10.77.0.1")
c.JupyterHub.hub_connect_ip = c.JupyterHub.hub_ip
