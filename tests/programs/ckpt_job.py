"""A job that writes a checkpoint file of a given size into its run directory, then sleeps: the
class tests' stand-in for training (clean, cancel --all and the class view act on its real run
directory and process; real training runs in the slurm-marked class test)."""

import argparse
import os
import time
from pathlib import Path

ap = argparse.ArgumentParser()
ap.add_argument("--run-dir", required=True)
ap.add_argument("--bytes", type=int, default=1_000_000)
ap.add_argument("--sleep", type=float, default=0.0)
a = ap.parse_args()
if int(os.environ.get("RANK", "0")) == 0:
    ck = Path(a.run_dir) / "checkpoints" / "iter_0000002"
    ck.mkdir(parents=True, exist_ok=True)
    (ck / "model.pt").write_bytes(b"\0" * a.bytes)
time.sleep(a.sleep)
