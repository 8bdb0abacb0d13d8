"""The embodied workflow."""
