"""Ready-made recipes: tuned settings for a workflow, and a plain single-process reference loop for each."""
