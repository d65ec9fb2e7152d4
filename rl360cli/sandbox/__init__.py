"""The sandbox layer: Harbor tasks, the process and docker providers, attempts, admission waves, the taxonomy.

Start at docs/sandboxes.md. Importing this package imports nothing heavy; the docker provider (docker SDK)
is loaded only by `providers.make_provider` when a recipe asks for it.
"""
