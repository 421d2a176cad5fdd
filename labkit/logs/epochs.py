"""Steps a loop counts within each epoch: ``Epoch [2/5], Step [100/600], Loss: ...`` (the PyTorch
tutorials' loop, tensorflow-nlp's ``Epoch 2/2 | Step 50/781 | ...``, llama-recipes' ``Training Epoch:
1/3, step 10/36 completed``).

A line that names an epoch ``E`` (of ``N``) before a step counter ``S/M`` may count its steps from the
run's start (``M`` the steps planned) or within the epoch (``M`` the epoch's steps): one line does not
say which. The log does: where the step counter starts again as the epoch advances, the steps count
within each epoch, and the run's step is ``(E - first) x M + S`` (``first`` 0 where the log prints an
epoch 0, else 1), ``N x M`` the steps planned. Where it never starts again, the counter is the run's.
"""

from __future__ import annotations

import re
from typing import Any

_EPOCH = re.compile(r"(?i)(?<![\w/])epoch\s{0,4}[:=]?\s{0,4}\[?\s{0,4}(\d{1,9})(?:\s{0,4}/\s{0,4}(\d{1,9}))?")


def mark(text: str, counter: re.Match, rec: dict[str, Any]) -> None:
    """Note in ``rec`` (``_in_epoch``: E, N) the epoch a line names before its step counter ``S/M``."""
    if counter.group(2) and "poch" in text[:counter.start()] and counter.group()[:1] not in "gG":
        e = _EPOCH.search(text, 0, counter.start())
        if e is not None:
            rec["_in_epoch"] = (int(e.group(1)), int(e.group(2)) if e.group(2) else None)


def number(recs: list[dict[str, Any]]) -> None:
    """Renumber the records of steps counted within epochs (in log order) as the run's steps, where
    the log shows the counter starting again in a later epoch; drop the marks."""
    marked = [r for r in recs if "_in_epoch" in r]
    last: tuple[int, int] | None = None
    again = False
    for r in marked:
        epoch = r["_in_epoch"][0]
        if last is not None and epoch > last[0] and r["iteration"] <= last[1]:
            again = True
            break
        last = (epoch, r["iteration"])
    first = 0 if any(r["_in_epoch"][0] == 0 for r in marked) else 1
    for r in marked:
        epoch, epochs = r.pop("_in_epoch")
        per_epoch = r.get("train_iters")
        if again and per_epoch:
            r["iteration"] += (epoch - first) * per_epoch
            r["_derived"] = True
            if epochs:
                r["train_iters"] = epochs * per_epoch
            else:
                del r["train_iters"]
