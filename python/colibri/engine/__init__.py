"""The loaded engine: a manifest turned into the core's spec and tensors, the RAM budget,
the expert store's settings and statistics, and the handle that the generation layer
holds of a loaded model."""
