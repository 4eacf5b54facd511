"""The small arithmetic the trainer owns: advantages, the typed training batch, loss weights, importance sampling."""
