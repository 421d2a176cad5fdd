"""Model presets and the notebooks' cpu|gpu profiles that ``RunConfig`` builds runs from.

``PRESETS`` hold model fields only (a run adds its own layout and batch);
``PROFILES`` are what papermill's ``-p profile cpu|gpu`` picks: a preset plus device, precision,
cluster shape and batch.
"""

from __future__ import annotations

from typing import Any

# Model presets: the model fields only; runs add their own layout and batch.
PRESETS: dict[str, dict[str, Any]] = {
    # A few layers, hidden 128, BPE vocab of 4096: trains on CPU in seconds per iteration.
    "tiny": dict(num_layers=4, hidden_size=128, num_attention_heads=4, seq_length=128,
                 max_position_embeddings=128, vocab_size=4096),
    "gpt2-124m": dict(num_layers=12, hidden_size=768, num_attention_heads=12, seq_length=1024,
                      max_position_embeddings=1024, vocab_size=50257),
    "gpt2-350m": dict(num_layers=24, hidden_size=1024, num_attention_heads=16, seq_length=1024,
                      max_position_embeddings=1024, vocab_size=50257),
    "gpt-1.3b": dict(num_layers=24, hidden_size=2048, num_attention_heads=16, seq_length=2048,
                     max_position_embeddings=2048, vocab_size=50257),
    # The GPT of NVIDIA DLI's Megatron-LM multi-node lab: 12 layers, 768 hidden, 32 heads.
    "dli-gpt": dict(num_layers=12, hidden_size=768, num_attention_heads=32, seq_length=1024,
                    max_position_embeddings=1024, vocab_size=50257),
}

# Notebook profiles: papermill picks one with -p profile cpu|gpu (notebooks/README.md).
# On the gpu profile, gpus_per_node and gpu_memory_gb are only defaults: a site profile that
# gives its own (ClusterProfile.gpus_per_node, .gpu_memory_gb) wins (RunConfig.for_profile).
PROFILES: dict[str, dict[str, Any]] = {
    "cpu": dict(preset="tiny", device="cpu", precision="fp32", nodes=2, gpus_per_node=2,
                micro_batch_size=2, global_batch_size=8, gpu_memory_gb=80.0),
    "gpu": dict(preset="gpt2-124m", device="cuda", precision="bf16", nodes=2, gpus_per_node=8,
                micro_batch_size=4, global_batch_size=64, gpu_memory_gb=80.0,
                attention_backend="flash", lr=6e-4, min_lr=6e-5, lr_warmup_iters=10,
                train_iters=100, log_interval=10),
}
