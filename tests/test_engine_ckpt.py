"""code/engine_ckpt.py without training: the queue dist-checkpointing's writer reports through.

megatron-core starts that queue's manager at a rank's first save in a spawn context, a fresh
interpreter that imports torch and megatron-core again (2-3 s of CPU per rank, waited for by the
save). On CPU the engine starts it forked instead. Checked in a fresh interpreter, as a rank
would be: if a megatron-core update renames or drops the queue, this fails and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CODE = Path(__file__).resolve().parents[1] / "code"

PROBE = f"""
import json, multiprocessing, sys
sys.path.insert(0, {str(CODE)!r})
import torch, cpu_compat
cpu_compat.apply()
import engine_ckpt
from megatron.core.dist_checkpointing.strategies import filesystem_async as fa
before = getattr(fa, "_results_queue", "absent")
engine_ckpt._forked_results_queue()
queue = fa._results_queue
queue.put({{"write": "results"}})
children = [type(p._popen).__module__ for p in multiprocessing.active_children()]
print(json.dumps({{"before": None if before is None else str(before), "children": children,
                  "echo": queue.get(timeout=30), "again_same": (engine_ckpt._forked_results_queue()
                  or fa._results_queue) is queue}}))
"""


def test_the_writer_queue_is_served_by_a_forked_manager_on_cpu():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=300, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["before"] is None, (
        f"megatron-core's dist-checkpointing has no `_results_queue` = None any more "
        f"({r['before']}): code/engine_ckpt.py's _forked_results_queue does nothing; see where "
        f"its FileSystemWriterAsync gets its results queue now")
    assert r["children"] == ["multiprocessing.popen_fork"], r  # one manager, forked, not spawned
    assert r["echo"] == {"write": "results"} and r["again_same"] is True
