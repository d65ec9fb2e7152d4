"""The agent session: one multi-turn attempt at a task, token in, token out.

- `conversation`: what an action and an observation look like, and `ConversationTokens`, which
  builds the conversation's token ids from the engine's own tokens without re-tokenizing.
- `session`: `run_session`, the engine and a sandbox in turns, then the verifier, as a `Trajectory`.
- `config`: `RolloutConfig`, a recipe's `[rollout]` (the agent's budgets, sampling, sessions at once).
"""
