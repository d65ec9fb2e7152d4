"""Generation across Ray session actors: each actor runs a share of a step's sessions and hands back
compacted trajectories, one group at a time (`rollouts.Rollouts`, `session_actor.SessionActor`).
"""
