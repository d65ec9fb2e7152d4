"""rl360: agentic reinforcement learning of language models, and the Slurm-first CLI that runs it."""

__version__ = "0.1.0"
