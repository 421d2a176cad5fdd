"""labkit: a lab kit for multi-node Megatron-style LLM training on Slurm, from Jupyter.

The notebooks call this package; it builds and validates runs (``RunConfig``), plans layouts,
renders and submits jobs, and turns logs into DataFrames and plots.
"""

from labkit.config import PRESETS, PROFILES, RunConfig
from labkit.errors import ConfigError, JobFailedError, LabkitError, SubmissionError

__version__ = "0.1.0"
__all__ = ["RunConfig", "PRESETS", "PROFILES", "LabkitError", "ConfigError", "SubmissionError",
           "JobFailedError", "__version__"]
