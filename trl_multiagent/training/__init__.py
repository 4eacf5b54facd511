"""The small arithmetic the trainer owns: advantages, the samples of a step's episodes, the typed training batch, loss
weights, importance sampling."""
