"""The demo task families: a task is data plus a reward (as nanochat keeps its `tasks/`); named `demo`
so as not to be taken for Harbor tasks (`sandbox/task.py`).

- `arith`: small functions of x described in words; the generator, the canonical answer and the
  verifier that `recipes/tasks/generate_arith.py` writes into each Harbor task's tests.
- `warmup`, `tokenizer`, `tiny_policy`: the local recipe's tiny policy — a tokenizer trained on
  the task family, a small Llama, a supervised warm-up on synthetic arith conversations.
- `arith_rollout`, `sampling`: the agent loop on arith tasks in process, for tuning and tests.
"""
