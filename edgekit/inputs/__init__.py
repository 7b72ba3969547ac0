"""What the user brings: the model source, data sets, streaming state, recipes and target classes."""
