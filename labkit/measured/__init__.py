"""What a run measured, read back from its run directory, and the plots of it.

One module per record a run leaves behind:

- ``tb``: TensorBoard event files (``RUN_DIR/tb/``) as scalars, and the ``tensorboard`` command.
- ``profiling``: torch.profiler Chrome traces as a per-rank step-time breakdown; memory timelines.
- ``step_memory``: memory of training steps by category, from torch.profiler's memory profile.
- ``memory``: tensor memory per rank and component (``RUN_DIR/memory/``) beside the planner's.
- ``timeline``: the pipeline as it ran (``RUN_DIR/timeline/``), its bubble and idle time.
- ``comm``: collective bandwidth results (the all-reduce benchmark, nccl-tests output).
- ``metrics``: throughput, TFLOP/s per device, MFU and scaling efficiency from parsed logs.
- ``hardware``: the one table of accelerators' dense peak FLOP/s that MFU and the planner read.
- ``plots``: matplotlib plots of all of the above and of parsed logs.

Import the module you need (``from labkit.measured.tb import read_scalars``); nothing is imported
here, so the CLI does not load pandas or matplotlib on start-up.
"""
