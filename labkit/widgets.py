"""ipywidgets for the notebooks: a layout builder that validates live, and a small job monitor.

Both work headless (papermill): building a widget needs no front end, and the logic behind each
widget is a plain function (``evaluate_layout``, ``job_snapshot``) that tests call directly.
"""

from __future__ import annotations

import html
import time
from typing import Any

from labkit.config import RunConfig
from labkit.errors import ConfigError
from labkit.planner import plan as _plan


def evaluate_layout(profile: str = "cpu", **fields: Any) -> dict[str, Any]:
    """Validate a layout and predict its memory per pipeline stage.

    Returns ``{"valid": bool, "errors": [...], "summary": str, "plan": dict | None}``;
    ``plan`` is the planner's ``plan(cfg).to_dict()``.
    """
    try:
        cfg = RunConfig.for_profile(profile, **fields)
    except ConfigError as e:
        return {"valid": False, "errors": e.violations, "summary": "", "plan": None}
    return {"valid": True, "errors": [], "summary": cfg.summary(), "plan": _plan(cfg).to_dict()}


def render_layout_html(result: dict[str, Any]) -> str:
    """The builder's panel as HTML (pure: same result, same text)."""
    if not result["valid"]:
        items = "".join(f"<li>{html.escape(e)}</li>" for e in result["errors"])
        return f"<div style='color:#b00020'><b>Invalid layout</b><ul>{items}</ul></div>"
    parts = [f"<pre>{html.escape(result['summary'])}</pre>"]
    plan = result.get("plan")
    if plan:
        mem = plan.get("memory_gb", {})
        rows = []
        for stage in ("first_stage", "last_stage"):
            s = mem.get(stage) or {}
            cells = "".join(f"<td>{s.get(k, float('nan')):.3f}</td>" for k in
                            ("weights", "gradients", "optimizer", "startup", "activations",
                             "logits", "total"))
            rows.append(f"<tr><td>{stage.replace('_', ' ')}</td>{cells}</tr>")
        fits = plan.get("fits")
        verdict = ("<b style='color:#1b5e20'>fits</b>" if fits else
                   "<b style='color:#b00020'>does NOT fit</b>")
        parts.append(
            "<table><tr><th>stage</th><th>weights</th><th>grads</th><th>optimizer</th>"
            "<th>start-up</th><th>activations</th><th>logits</th><th>total GB</th></tr>" + "".join(rows)
            + "</table>"
            + f"<p>peak {mem.get('peak', float('nan')):.3f} GB per device; needs "
              f"{plan.get('required_gb', mem.get('peak', float('nan'))):.3f} GB (x allocator "
              f"factor, + runtime) against a limit of "
              f"{plan.get('gpu_memory_gb', float('nan')):.3g} GB: {verdict}; pipeline bubble "
              f"{plan.get('bubble_fraction', 0):.1%}</p>")
    return "".join(parts)


def _memory_field(profile: str, **base: Any) -> tuple[str, float]:
    """The RunConfig field the planner compares memory against, and its value."""
    cfg = RunConfig.for_profile(profile, **base)
    if cfg.device == "cpu" and cfg.memory_limit_gb is not None:
        return "memory_limit_gb", float(cfg.memory_limit_gb)
    return "gpu_memory_gb", float(cfg.gpu_memory_gb)


def layout_builder(profile: str = "cpu", *, nodes: int = 2, gpus_per_node: int = 2,
                   **base: Any) -> Any:
    """TP / PP / micro / global batch sliders and the memory per rank; every change is
    validated and planned (a ConfigError's message is shown as it is).

    Returns the widget (display it as the cell's last expression). ``base`` holds further
    RunConfig fields (e.g. ``num_layers``). The memory slider sets what ``fits`` compares with:
    ``gpu_memory_gb``, or ``memory_limit_gb`` on a CPU profile that has such a cap.
    """
    # ipywidgets and IPython: only inside a notebook
    import ipywidgets as w

    ws = nodes * gpus_per_node
    defaults = RunConfig.for_profile(profile, **base)
    mem_field, mem_gb = _memory_field(profile, **base)
    tp = w.IntSlider(value=1, min=1, max=ws, description="TP")
    pp = w.IntSlider(value=1, min=1, max=ws, description="PP")
    mbs = w.IntSlider(value=defaults.micro_batch_size, min=1, max=32, description="micro batch")
    gbs = w.IntSlider(value=defaults.global_batch_size, min=1, max=512,
                      description="global batch")
    mem = w.FloatLogSlider(value=mem_gb, base=10, min=-3, max=3, step=0.05,
                           description="GB per rank", readout_format=".3g")
    panel = w.HTML()
    panel.add_class("labkit-layout-panel")

    def update(*_: Any) -> None:
        fields = {**base, mem_field: mem.value}
        result = evaluate_layout(profile, nodes=nodes, gpus_per_node=gpus_per_node,
                                 tensor_model_parallel_size=tp.value,
                                 pipeline_model_parallel_size=pp.value,
                                 micro_batch_size=mbs.value, global_batch_size=gbs.value,
                                 **fields)
        panel.value = render_layout_html(result)

    for s in (tp, pp, mbs, gbs, mem):
        s.observe(update, names="value")
    update()
    box = w.VBox([w.HBox([tp, pp]), w.HBox([mbs, gbs, mem]), panel])
    box.add_class("labkit-layout-builder")
    return box


def job_snapshot(job: Any, lines: int = 5) -> str:
    """One text frame of the monitor: state, run directory and the log's last lines."""
    state = job.state()
    state = getattr(state, "value", state)
    try:
        tail = job.tail(lines) if callable(getattr(job, "tail", None)) else ""
    except Exception as e:  # a log that does not exist yet is normal for a pending job
        tail = f"(no log yet: {e})"
    if isinstance(tail, list):
        tail = "\n".join(tail)
    name = getattr(job, "name", None) or getattr(job, "job_id", "?")
    if callable(getattr(job, "status_line", None)):  # PENDING's reason, RUNNING's iteration
        state = job.status_line(state)
    # labkit.lab brings pandas: the layout builder stays light
    from labkit.lab import shown

    return shown(f"{name} [{state}] {getattr(job, 'run_dir', '')}\n{tail}")


def job_monitor(job: Any, *, refresh_s: float = 2.0, timeout_s: float | None = None,
                lines: int = 5) -> Any:
    """Show a job's state and log tail, refreshed until it ends; returns the final state."""
    # ipywidgets and IPython: only inside a notebook
    import ipywidgets as w
    from IPython.display import display

    box = w.HTML()
    display(box)
    t0 = time.monotonic()
    final = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL",
             "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
    while True:
        text = job_snapshot(job, lines)
        box.value = f"<pre>{html.escape(text)}</pre>"
        state = job.state()
        state = getattr(state, "value", state)
        if state in final or (timeout_s is not None and time.monotonic() - t0 > timeout_s):
            print(text)  # the last frame as plain output: readable in a saved/headless notebook
            return state
        time.sleep(refresh_s)
