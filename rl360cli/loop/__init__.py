"""The run: the trainer component's driver (`python -m rl360cli.run.driver`) and the overlapped loop.

- `train_loop`: generate step k+1 while step k trains, build the batch, train, broadcast (`train_loop`).
- `driver`: sets up Ray, the session actors, the trainer and the weight sync for one run, runs the
  loop and keeps the run's record in the state file current.
- `samples`: a few decoded trajectories of every step in `samples.jsonl`, and the sessions `rl360 report`'s
  trajectories page shows, as the model saw them, in `trajectories.jsonl`.
- `config`: `LoopConfig`, a recipe's `[loop]`.
"""
