"""The egress proxy: how a sandbox that a task lets onto the network goes out, under the profile's `[egress]`.

Start at docs/sandboxes.md ("Network: Harbor's fields and the profile's [egress]"). Importing this package
imports nothing.
"""
