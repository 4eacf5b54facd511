"""Rollout engine: runs workflow episodes and batches their model calls; typed records of what happened."""
