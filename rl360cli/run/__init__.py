"""A run's lifecycle, in one layer: starting it, following it, stopping it and ending it.

- `lifecycle`: start (or resume) a run, stop it, end it and stop what served it.
- `backends`: `backend_for(profile, state)`, the one place a backend is chosen.
- `policy`: policy version 0 of a recipe (`prepare_policy`: the demo's tiny policy, a GGUF file, a folder).
- `driver`: the trainer component (`python -m rl360cli.run.driver`): Ray, the session actors, the
  trainer and the weight sync for one run; it runs the loop and records the run's progress.
- `control`: the run's control plane (`python -m rl360cli.run.control`): watches the run's engines and
  router and starts again what dies, from outside the trainer's process.
"""
