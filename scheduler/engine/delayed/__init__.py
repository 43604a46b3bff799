"""Delayed delivery in the leader: intake, the horizon, claims, the armed set, dispatch, books."""
